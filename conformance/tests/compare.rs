//! `conformance --compare A.json B.json` exits non-zero, naming each case, when the two
//! reports do not agree, and zero when they do (the rules are tested in `report.rs`).
use std::path::PathBuf;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_conformance");

fn tmp(name: &str, text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("conformance-compare-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

fn compare(a: &PathBuf, b: &PathBuf) -> (Option<i32>, String) {
    let o = Command::new(BIN).arg("--compare").arg(a).arg(b).output().unwrap();
    let text = String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr);
    (o.status.code(), text)
}

/// A real report of the sim (a few cases), as the runner writes it, compares clean with
/// itself; the same report with one case failing and one missing does not.
#[test]
fn compare_exits_non_zero_when_the_reports_disagree() {
    let o = Command::new(BIN)
        .args(["--backend", "sim", "--json", "--filter", "device"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let sim = String::from_utf8(o.stdout).unwrap();
    let mut report: serde_json::Value = serde_json::from_str(&sim).unwrap();
    assert_eq!(report["capabilities"]["atomic_cap"], "hca", "{sim}");
    let cases = report["cases"].as_array().unwrap().len();
    assert!(cases >= 2, "{sim}");
    let a = tmp("sim.json", &sim);

    let (code, text) = compare(&a, &a);
    assert_eq!(code, Some(0), "{text}");
    assert!(
        text.contains(&format!("the reports agree on all {cases} cases")),
        "{text}"
    );

    let rows = report["cases"].as_array_mut().unwrap();
    let first = rows[0]["id"].as_str().unwrap().to_string();
    rows[0]["status"] = "fail".into();
    rows[0]["detail"] = "expected 1, got 2".into();
    let gone = rows.pop().unwrap()["id"].as_str().unwrap().to_string();
    let b = tmp("other.json", &report.to_string());
    let (code, text) = compare(&a, &b);
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("do not agree on 2 case(s)"), "{text}");
    assert!(
        text.contains(&format!(
            "- {first}: fails on sim:sim0 (portable): expected 1, got 2"
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "- {gone}: missing from the report of sim:sim0 (portable)"
        )),
        "{text}"
    );
}

/// The runner records, per case, what the device did (statuses, errnos): the sim under
/// `--profile rxe` reports rxe's status pair for a receive too small, and `--compare`
/// fails against the portable report on exactly that observation, naming both values;
/// changing one observed status in a copy of a report makes an otherwise identical
/// comparison fail.
#[test]
fn compare_fails_when_one_observed_status_differs() {
    let run = |profile: &str| {
        let o = Command::new(BIN)
            .args([
                "--backend",
                "sim",
                "--json",
                "--profile",
                profile,
                "--filter",
                "errors.recv-too-small",
            ])
            .env_remove("RDMA_SIM_PROFILE")
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8(o.stdout).unwrap()
    };
    let portable = run("portable");
    let report: serde_json::Value = serde_json::from_str(&portable).unwrap();
    assert_eq!(report["profile"], "portable");
    let row = &report["cases"][0];
    assert_eq!(row["observed"]["responder"], "LocLenErr", "{portable}");
    assert_eq!(row["observed"]["requester"], "RemInvReqErr", "{portable}");
    let rxe = run("rxe");
    let (a, b) = (tmp("obs-portable.json", &portable), tmp("obs-rxe.json", &rxe));
    let (code, text) = compare(&a, &b);
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains(
            "- errors.recv-too-small: observed requester: RemInvReqErr on sim:sim0 (portable), \
             RemOpErr on sim:sim0 (rxe); observed responder: LocLenErr on sim:sim0 (portable), \
             LocQpOpErr on sim:sim0 (rxe)"
        ),
        "{text}"
    );

    // One observed status changed, all else equal: the comparison fails on it alone.
    let mut changed = report.clone();
    changed["cases"][0]["observed"]["responder"] = "LocProtErr".into();
    let c = tmp("obs-changed.json", &changed.to_string());
    assert_eq!(compare(&a, &a).0, Some(0));
    let (code, text) = compare(&a, &c);
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("do not agree on 1 case(s)"), "{text}");
    assert!(
        text.contains(
            "observed responder: LocLenErr on sim:sim0 (portable), LocProtErr on sim:sim0 (portable)"
        ),
        "{text}"
    );
}
