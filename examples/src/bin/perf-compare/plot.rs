//! The curves of `--curves` as an SVG plot (`--plot FILE.svg`), drawn with plotters.

use anyhow::anyhow;
use examples::Res;
use plotters::coord::Shift;
use plotters::prelude::*;

use crate::report::Report;

/// One half of the plot.
type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;

/// A legend entry's sample: a short line in the series' colour.
fn swatch(
    color: plotters::style::RGBColor,
) -> impl Fn((i32, i32)) -> plotters::element::PathElement<(i32, i32)> {
    move |(x, y)| plotters::element::PathElement::new(vec![(x, y), (x + 20, y)], color)
}

/// Writes the curves as an SVG plot: latency and bandwidth against message size (left)
/// and against the number of QPs (right).
pub fn plot(rep: &Report, path: &std::path::Path) -> Res<()> {
    let root = SVGBackend::new(path, (1100, 420)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow!("plot: {e}"))?;
    let (left, right) = root.split_horizontally(550);
    size_chart(&left, rep)?;
    qp_chart(&right, rep)?;
    root.present().map_err(|e| anyhow!("plot: {e}"))?;
    Ok(())
}

/// A drawing error as an error of the plot.
fn e<E: std::error::Error + Send + Sync>(e: DrawingAreaErrorKind<E>) -> anyhow::Error {
    anyhow!("plot: {e}")
}

/// Left: latency and bandwidth against message size.
fn size_chart(area: &Area<'_>, rep: &Report) -> Res<()> {
    if rep.size_curve.is_empty() {
        return Ok(());
    }
    let max_lat = rep.size_curve.iter().map(|p| p.write_lat_us).fold(1.0, f64::max) * 1.2;
    let max_bw = rep.size_curve.iter().map(|p| p.write_bw_mbps).fold(1.0, f64::max) * 1.2;
    let sizes = (
        rep.size_curve[0].size,
        rep.size_curve.last().map_or(2, |p| p.size),
    );
    let mut c = ChartBuilder::on(area)
        .caption("sim write_lat / write_bw vs message size", ("sans-serif", 16))
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(55)
        .right_y_label_area_size(55)
        .build_cartesian_2d((sizes.0..sizes.1).log_scale(), (0.5..max_lat).log_scale())
        .map_err(e)?
        .set_secondary_coord((sizes.0..sizes.1).log_scale(), 0.0..max_bw);
    c.configure_mesh()
        .x_desc("bytes")
        .y_desc("write_lat typical (us)")
        .draw()
        .map_err(e)?;
    c.configure_secondary_axes()
        .y_desc("write_bw (MB/s)")
        .draw()
        .map_err(e)?;
    c.draw_series(LineSeries::new(
        rep.size_curve.iter().map(|p| (p.size, p.write_lat_us)),
        &BLUE,
    ))
    .map_err(e)?
    .label("write_lat (us, left)")
    .legend(swatch(BLUE));
    c.draw_secondary_series(LineSeries::new(
        rep.size_curve.iter().map(|p| (p.size, p.write_bw_mbps)),
        &RED,
    ))
    .map_err(e)?
    .label("write_bw (MB/s, right)")
    .legend(swatch(RED));
    c.configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(e)?;
    Ok(())
}

/// Right: latency and aggregate bandwidth against the number of QPs.
fn qp_chart(area: &Area<'_>, rep: &Report) -> Res<()> {
    if rep.qp_curve.is_empty() {
        return Ok(());
    }
    let max_lat = rep.qp_curve.iter().map(|p| p.write_lat_us).fold(1.0, f64::max) * 1.3;
    let max_bw = rep
        .qp_curve
        .iter()
        .map(|p| p.write_bw_64k_mbps)
        .fold(1.0, f64::max)
        * 1.3;
    let qmax = rep.qp_curve.last().map_or(2, |p| p.qps as u32).max(2);
    let mut c = ChartBuilder::on(area)
        .caption("sim vs number of QPs (one device)", ("sans-serif", 16))
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(55)
        .right_y_label_area_size(55)
        .build_cartesian_2d((1u32..qmax).log_scale(), 0.0..max_lat)
        .map_err(e)?
        .set_secondary_coord((1u32..qmax).log_scale(), 0.0..max_bw);
    c.configure_mesh()
        .x_desc("QPs")
        .y_desc("8 B write latency (us)")
        .draw()
        .map_err(e)?;
    c.configure_secondary_axes()
        .y_desc("64 KiB write_bw aggregate (MB/s)")
        .draw()
        .map_err(e)?;
    c.draw_series(LineSeries::new(
        rep.qp_curve.iter().map(|p| (p.qps as u32, p.write_lat_us)),
        &BLUE,
    ))
    .map_err(e)?
    .label("latency (us, left)")
    .legend(swatch(BLUE));
    c.draw_secondary_series(LineSeries::new(
        rep.qp_curve.iter().map(|p| (p.qps as u32, p.write_bw_64k_mbps)),
        &RED,
    ))
    .map_err(e)?
    .label("bandwidth (MB/s, right)")
    .legend(swatch(RED));
    c.configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::LowerLeft)
        .draw()
        .map_err(e)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{QpPoint, SizePoint};

    #[test]
    fn both_charts_are_drawn() {
        let rep = Report {
            size_curve: (1..=4)
                .map(|i| SizePoint {
                    size: 8 << (2 * i),
                    write_lat_us: 5.0 * i as f64,
                    write_bw_mbps: 1000.0 * i as f64,
                })
                .collect(),
            qp_curve: [1, 4, 16]
                .map(|q| QpPoint {
                    qps: q,
                    depth: 16,
                    write_lat_us: 6.0,
                    write_bw_64k_mbps: 5000.0,
                })
                .to_vec(),
            ..Default::default()
        };
        let path = std::env::temp_dir().join(format!("perf-compare-plot-{}.svg", std::process::id()));
        plot(&rep, &path).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        for text in [
            "sim write_lat / write_bw vs message size",
            "sim vs number of QPs (one device)",
            "write_bw (MB/s, right)",
            "bandwidth (MB/s, right)",
        ] {
            assert!(svg.contains(text), "no {text:?} in the plot");
        }
    }
}
