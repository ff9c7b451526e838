//! Every Rust snippet of the README is compiled code.
//!
//! - Snippets that stand alone are this crate's doctests (`src/lib.rs` includes the README
//!   under `cfg(doctest)`), so `cargo test` compiles them (and runs those not marked
//!   `no_run`).
//! - Snippets taken from an example binary (`rust,ignore`, as they need the binary's other
//!   definitions) are preceded by `<!-- snippet: PATH -->` and must equal, byte for byte,
//!   the regions of PATH between `// README:begin` and `// README:end` lines, joined by one
//!   empty line. Edit the binary and copy the regions into the README, or the other way
//!   round: this test fails until both say the same.

use std::path::Path;

const SNIPPET_TAG: &str = "<!-- snippet: ";

fn root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

/// One fenced code block: the line its fence starts on (1-based), its info string, the
/// line before the fence, and its text (every line followed by a newline).
struct Block {
    line: usize,
    info: String,
    before: String,
    text: String,
}

fn blocks(md: &str) -> Vec<Block> {
    let lines: Vec<&str> = md.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        if let Some(info) = lines[i].strip_prefix("```") {
            let start = i;
            let mut text = String::new();
            i += 1;
            while i < lines.len() && !lines[i].starts_with("```") {
                text.push_str(lines[i]);
                text.push('\n');
                i += 1;
            }
            assert!(
                i < lines.len(),
                "README.md:{}: code block never closed",
                start + 1
            );
            out.push(Block {
                line: start + 1,
                info: info.trim().to_string(),
                before: if start > 0 {
                    lines[start - 1].to_string()
                } else {
                    String::new()
                },
                text,
            });
        }
        i += 1;
    }
    out
}

/// The README:begin .. README:end regions of a source file, joined by one empty line.
fn regions(src: &str, path: &str) -> String {
    let mut out = Vec::new();
    let mut cur: Option<String> = None;
    for (n, line) in src.lines().enumerate() {
        let t = line.trim_start();
        if t.starts_with("// README:begin") {
            assert!(cur.is_none(), "{path}:{}: README:begin inside a region", n + 1);
            cur = Some(String::new());
        } else if t.starts_with("// README:end") {
            out.push(
                cur.take()
                    .unwrap_or_else(|| panic!("{path}:{}: README:end outside a region", n + 1)),
            );
        } else if let Some(c) = cur.as_mut() {
            c.push_str(line);
            c.push('\n');
        }
    }
    assert!(cur.is_none(), "{path}: a README region is never ended");
    assert!(!out.is_empty(), "{path}: no README:begin/README:end region");
    out.join("\n")
}

fn is_rust(info: &str) -> bool {
    // rustdoc's rule: no language, or `rust` with attributes, is Rust.
    let first = info.split(',').next().unwrap_or("").trim();
    first.is_empty() || first == "rust"
}

#[test]
fn readme_excerpts_equal_the_marked_regions_of_their_example() {
    let md = std::fs::read_to_string(root().join("README.md")).unwrap();
    let mut excerpts = 0;
    for b in blocks(&md).iter().filter(|b| is_rust(&b.info)) {
        let ignored = b.info.split(',').any(|a| a.trim() == "ignore");
        let tag = b
            .before
            .trim()
            .strip_prefix(SNIPPET_TAG)
            .and_then(|t| t.strip_suffix("-->"));
        match (ignored, tag) {
            (false, None) => {} // a doctest
            (false, Some(_)) => panic!(
                "README.md:{}: a snippet taken from an example must be `rust,ignore` (it is checked here, not compiled alone)",
                b.line
            ),
            (true, None) => panic!(
                "README.md:{}: an ignored Rust snippet must be preceded by `{SNIPPET_TAG}PATH -->` naming the file it is taken from; otherwise make it compile as a doctest",
                b.line
            ),
            (true, Some(path)) => {
                let path = path.trim();
                let src = std::fs::read_to_string(root().join(path))
                    .unwrap_or_else(|e| panic!("README.md:{}: {path}: {e}", b.line));
                let want = regions(&src, path);
                if b.text != want {
                    let (n, (r, s)) = b
                        .text
                        .lines()
                        .zip(want.lines())
                        .enumerate()
                        .find(|(_, (r, s))| r != s)
                        .unwrap_or((b.text.lines().count().min(want.lines().count()), ("(end)", "(end)")));
                    panic!(
                        "README.md:{}: the snippet differs from the README regions of {path}, first at its line {}:\n  README: {r}\n  source: {s}\n--- the regions, to paste into the README ---\n{want}",
                        b.line,
                        n + 1
                    );
                }
                excerpts += 1;
            }
        }
    }
    assert!(excerpts > 0, "no README snippet is checked against an example");
}

#[test]
fn the_readme_is_compiled_as_doctests() {
    let lib = std::fs::read_to_string(root().join("examples/src/lib.rs")).unwrap();
    assert!(
        lib.contains("#[cfg(doctest)]") && lib.contains("include_str!(\"../../README.md\")"),
        "examples/src/lib.rs must include README.md as doctests"
    );
}

#[test]
fn the_region_parser_joins_regions_and_the_block_parser_sees_info_strings() {
    let src =
        "a\n// README:begin\nfn x() {}\n// README:end\nb\n    // README:begin\n    y\n    // README:end\n";
    assert_eq!(regions(src, "t.rs"), "fn x() {}\n\n    y\n");
    let md = "x\n<!-- snippet: f.rs -->\n```rust,ignore\nfn x() {}\n```\n```sh\nls\n```\n";
    let b = blocks(md);
    assert_eq!(b.len(), 2);
    assert_eq!(
        (b[0].line, b[0].info.as_str(), b[0].text.as_str()),
        (3, "rust,ignore", "fn x() {}\n")
    );
    assert_eq!(b[0].before, "<!-- snippet: f.rs -->");
    assert!(is_rust(&b[0].info) && !is_rust(&b[1].info) && is_rust(""));
}
