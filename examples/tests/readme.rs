//! Every Rust snippet of the README and of `docs/*.md` is compiled code, and every link
//! between them leads somewhere.
//!
//! - Snippets that stand alone are this crate's doctests (`src/lib.rs` includes each such
//!   page under `cfg(doctest)`), so `cargo test` compiles them (and runs those not marked
//!   `no_run`).
//! - Snippets taken from an example binary (`rust,ignore`, as they need the binary's other
//!   definitions) are preceded by `<!-- snippet: PATH -->` and must equal, byte for byte,
//!   the regions of PATH between `// README:begin` and `// README:end` lines, joined by one
//!   empty line. Edit the binary and copy the regions into the page, or the other way
//!   round: this test fails until both say the same.
//! - A relative link names a file that exists, and its `#anchor` a heading of that page.

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

fn blocks(md: &str, name: &str) -> Vec<Block> {
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
            assert!(i < lines.len(), "{name}:{}: code block never closed", start + 1);
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

/// The pages whose snippets and links are checked: the README and `docs/*.md`, as paths
/// from the workspace's root.
fn pages() -> Vec<String> {
    let mut v = vec!["README.md".to_string()];
    let mut docs: Vec<String> = std::fs::read_dir(root().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md"))
        .map(|n| format!("docs/{n}"))
        .collect();
    docs.sort();
    v.extend(docs);
    v
}

#[test]
fn snippets_equal_the_marked_regions_of_their_example() {
    let mut excerpts = 0;
    for page in pages() {
        let md = std::fs::read_to_string(root().join(&page)).unwrap();
        for b in blocks(&md, &page).iter().filter(|b| is_rust(&b.info)) {
            let ignored = b.info.split(',').any(|a| a.trim() == "ignore");
            let tag = b
                .before
                .trim()
                .strip_prefix(SNIPPET_TAG)
                .and_then(|t| t.strip_suffix("-->"));
            match (ignored, tag) {
                (false, None) => {} // a doctest
                (false, Some(_)) => panic!(
                    "{page}:{}: a snippet taken from an example must be `rust,ignore` (it is checked here, not compiled alone)",
                    b.line
                ),
                (true, None) => panic!(
                    "{page}:{}: an ignored Rust snippet must be preceded by `{SNIPPET_TAG}PATH -->` naming the file it is taken from; otherwise make it compile as a doctest",
                    b.line
                ),
                (true, Some(path)) => {
                    let path = path.trim();
                    let src = std::fs::read_to_string(root().join(path))
                        .unwrap_or_else(|e| panic!("{page}:{}: {path}: {e}", b.line));
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
                            "{page}:{}: the snippet differs from the README regions of {path}, first at its line {}:\n  page: {r}\n  source: {s}\n--- the regions, to paste into the page ---\n{want}",
                            b.line,
                            n + 1
                        );
                    }
                    excerpts += 1;
                }
            }
        }
    }
    assert!(excerpts > 0, "no snippet is checked against an example");
}

#[test]
fn pages_with_doctests_are_compiled_as_doctests() {
    let lib = std::fs::read_to_string(root().join("examples/src/lib.rs")).unwrap();
    assert!(
        lib.contains("#[cfg(doctest)]"),
        "examples/src/lib.rs must include the pages' doctests"
    );
    assert!(
        lib.contains("include_str!(\"../../README.md\")"),
        "examples/src/lib.rs must include README.md as doctests"
    );
    for page in pages() {
        let md = std::fs::read_to_string(root().join(&page)).unwrap();
        let doctests = blocks(&md, &page)
            .iter()
            .any(|b| is_rust(&b.info) && !b.info.split(',').any(|a| a.trim() == "ignore"));
        assert!(
            !doctests || lib.contains(&format!("include_str!(\"../../{page}\")")),
            "{page} has Rust snippets that are not `ignore`: examples/src/lib.rs must include it as doctests"
        );
    }
}

/// GitHub's anchor for a heading: lower case, punctuation but `-` and `_` dropped, spaces
/// as `-`.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of a page's headings (outside code blocks).
fn anchors(md: &str) -> Vec<String> {
    let mut fenced = false;
    let mut out = Vec::new();
    for line in md.lines() {
        if line.starts_with("```") {
            fenced = !fenced;
        } else if !fenced && line.starts_with('#') {
            out.push(anchor(line.trim_start_matches('#')));
        }
    }
    out
}

/// The targets of a page's inline links `[text](target)`, outside code blocks, with the
/// line each is on.
fn links(md: &str) -> Vec<(usize, String)> {
    let mut fenced = false;
    let mut out = Vec::new();
    for (n, line) in md.lines().enumerate() {
        if line.starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let mut rest = line;
        while let Some(i) = rest.find("](") {
            rest = &rest[i + 2..];
            if let Some(end) = rest.find(')') {
                out.push((n + 1, rest[..end].to_string()));
                rest = &rest[end..];
            }
        }
    }
    out
}

#[test]
fn links_between_pages_lead_somewhere() {
    for page in pages() {
        let md = std::fs::read_to_string(root().join(&page)).unwrap();
        let dir = root().join(&page).parent().unwrap().to_path_buf();
        for (line, target) in links(&md) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (file, frag) = match target.split_once('#') {
                Some((f, a)) => (f, Some(a)),
                None => (target.as_str(), None),
            };
            let path = if file.is_empty() {
                root().join(&page)
            } else {
                dir.join(file)
            };
            assert!(path.exists(), "{page}:{line}: the link {target} leads to no file");
            if let (Some(frag), true) = (frag, file.is_empty() || file.ends_with(".md")) {
                let text = std::fs::read_to_string(&path).unwrap();
                assert!(
                    anchors(&text).iter().any(|a| a == frag),
                    "{page}:{line}: the link {target}: no heading of {} has the anchor #{frag}",
                    path.display()
                );
            }
        }
    }
}

#[test]
fn the_region_parser_joins_regions_and_the_block_parser_sees_info_strings() {
    let src =
        "a\n// README:begin\nfn x() {}\n// README:end\nb\n    // README:begin\n    y\n    // README:end\n";
    assert_eq!(regions(src, "t.rs"), "fn x() {}\n\n    y\n");
    let md = "x\n<!-- snippet: f.rs -->\n```rust,ignore\nfn x() {}\n```\n```sh\nls\n```\n";
    let b = blocks(md, "t.md");
    assert_eq!(b.len(), 2);
    assert_eq!(
        (b[0].line, b[0].info.as_str(), b[0].text.as_str()),
        (3, "rust,ignore", "fn x() {}\n")
    );
    assert_eq!(b[0].before, "<!-- snippet: f.rs -->");
    assert!(is_rust(&b[0].info) && !is_rust(&b[1].info) && is_rust(""));
    assert_eq!(anchor(" What `vendor_err` says"), "what-vendor_err-says");
    assert_eq!(anchor(" libibverbs → verbs-api"), "libibverbs--verbs-api");
    assert_eq!(
        anchor(" Completion events: event-latency.sh"),
        "completion-events-event-latencysh"
    );
    assert_eq!(
        links("[a](x.md#y) and [b](#z)\n```\n[c](no)\n```\n"),
        vec![(1, "x.md#y".to_string()), (1, "#z".to_string())]
    );
}
