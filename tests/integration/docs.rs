//! The manual kept true: every page of the book (docs/src) is in its
//! SUMMARY.md, every relative link and image of README.md, CHANGELOG.md and
//! docs/ resolves to a file inside the repository (and an anchor to a
//! heading of its page), README's stage table is the one the stage
//! declarations generate ([`embodyflow_core::spec::markdown_table`], printed
//! by `pipeline stages --markdown`), and no Markdown file, comment or string
//! of the repository speaks of how the project was developed.
//!
//! Headings become anchors as mdBook and the forges make them: lower case,
//! spaces to `-`, every character but letters, digits, `-` and `_` dropped,
//! and `-1`, `-2`, … appended to repeats.

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};

use embodyflow_tests::run;

pub(crate) fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .unwrap()
}

/// Every file under `dir` (recursively) whose name ends with `ext` (any file
/// for `""`), sorted; none when `dir` is absent.
fn files_under(dir: &Path, ext: &str, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut paths: Vec<PathBuf> = entries.map(|e| e.unwrap().path()).collect();
    paths.sort();
    for path in paths {
        if path.is_dir() {
            files_under(&path, ext, out);
        } else if path.to_string_lossy().ends_with(ext) {
            out.push(path);
        }
    }
}

/// The pages of the book: docs/src/**/*.md, sorted.
pub(crate) fn book_pages() -> Vec<PathBuf> {
    let mut pages = Vec::new();
    files_under(&repo().join("docs/src"), ".md", &mut pages);
    pages
}

/// README.md, CHANGELOG.md (when present) and docs/**/*.md.
fn markdown_files() -> Vec<PathBuf> {
    let root = repo();
    let mut files: Vec<PathBuf> = ["README.md", "CHANGELOG.md"]
        .iter()
        .map(|f| root.join(f))
        .filter(|p| p.is_file())
        .collect();
    files_under(&root.join("docs"), ".md", &mut files);
    files
}

fn relative(path: &Path) -> String {
    path.strip_prefix(repo())
        .unwrap_or(path)
        .display()
        .to_string()
}

/// The lines of `text` outside fenced code blocks, with inline code spans
/// blanked, each with its line number (from 1).
fn prose_lines(text: &str) -> Vec<(usize, String)> {
    let mut fence: Option<String> = None;
    let mut lines = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        if let Some(open) = &fence {
            if trimmed.starts_with(open.as_str()) {
                fence = None;
            }
            continue;
        }
        if trimmed.starts_with("```") || trimmed.starts_with("~~~") {
            let marker: String = trimmed
                .chars()
                .take_while(|&c| c == trimmed.as_bytes()[0] as char)
                .collect();
            fence = Some(marker);
            continue;
        }
        let mut prose = String::new();
        let mut in_code = false;
        for c in line.chars() {
            if c == '`' {
                in_code = !in_code;
            }
            prose.push(if in_code && c != '`' { ' ' } else { c });
        }
        lines.push((n + 1, prose));
    }
    lines
}

/// The targets of the links and images of one line: `[text](target)`,
/// `![alt](target "title")`, `[label]: target` and `<img src="target">`.
fn link_targets(line: &str) -> Vec<String> {
    let mut targets = Vec::new();
    let mut rest = line;
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        // The target ends at the parenthesis that closes the link.
        let mut depth = 0;
        let mut end = after.len();
        for (i, c) in after.char_indices() {
            match c {
                '(' => depth += 1,
                ')' if depth == 0 => {
                    end = i;
                    break;
                }
                ')' => depth -= 1,
                _ => {}
            }
        }
        let target = after[..end].trim();
        let target = target.split_once(" \"").map_or(target, |(t, _)| t);
        targets.push(target.trim_matches(['<', '>']).to_string());
        rest = &after[end.min(after.len())..];
    }
    let trimmed = line.trim_start();
    if trimmed.starts_with('[')
        && let Some((label, target)) = trimmed.split_once("]: ")
        && !label.contains(']')
    {
        targets.push(target.split_whitespace().next().unwrap_or("").to_string());
    }
    let mut rest = line;
    while let Some(at) = rest.find("src=\"") {
        let after = &rest[at + 5..];
        let end = after.find('"').unwrap_or(after.len());
        targets.push(after[..end].to_string());
        rest = &after[end..];
    }
    targets
}

/// A heading's anchor (see the module doc).
fn slug(heading: &str) -> String {
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

/// The anchors of a Markdown text's headings (`#` lines outside code),
/// repeats numbered.
fn anchors(text: &str) -> BTreeSet<String> {
    let raw: Vec<&str> = text.lines().collect();
    let mut seen = BTreeSet::new();
    for (n, _) in prose_lines(text) {
        // The line as written: prose_lines blanks code spans.
        let Some(heading) = raw[n - 1].strip_prefix('#') else {
            continue;
        };
        let heading = heading.trim_start_matches('#');
        if !heading.starts_with(' ') {
            continue;
        }
        let base = slug(heading);
        let mut anchor = base.clone();
        let mut k = 0;
        while seen.contains(&anchor) {
            k += 1;
            anchor = format!("{base}-{k}");
        }
        seen.insert(anchor);
    }
    seen
}

/// What is wrong with the relative links and images of `file` (whose text
/// is `text`): a target that is not a file or directory inside the
/// repository, or an anchor that is no heading of its Markdown page.
fn broken_links(file: &Path, text: &str) -> Vec<String> {
    let root = repo();
    let mut broken = Vec::new();
    for (n, line) in prose_lines(text) {
        for target in link_targets(&line) {
            if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (path, anchor) = match target.split_once('#') {
                Some((path, anchor)) => (path, Some(anchor)),
                None => (target.as_str(), None),
            };
            let resolved = if path.is_empty() {
                file.to_path_buf()
            } else {
                normalize(&file.parent().unwrap().join(path))
            };
            let at = format!("{}:{n}: `{target}`", relative(file));
            if !resolved.starts_with(&root) {
                broken.push(format!("{at} points outside the repository"));
                continue;
            }
            if !resolved.exists() {
                broken.push(format!("{at}: no such file {}", relative(&resolved)));
                continue;
            }
            if let Some(anchor) = anchor
                && resolved.extension().is_some_and(|e| e == "md")
            {
                let page = if path.is_empty() {
                    text.to_string()
                } else {
                    std::fs::read_to_string(&resolved).unwrap()
                };
                if !anchors(&page).contains(anchor) {
                    broken.push(format!(
                        "{at}: no heading of {} has the anchor #{anchor}",
                        relative(&resolved)
                    ));
                }
            }
        }
    }
    broken
}

/// `path` with `.` and `..` resolved lexically.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

#[test]
fn every_relative_link_and_image_resolves() {
    let files = markdown_files();
    assert!(files.iter().any(|f| f.ends_with("README.md")), "{files:?}");
    let broken: Vec<String> = files
        .iter()
        .flat_map(|f| broken_links(f, &std::fs::read_to_string(f).unwrap()))
        .collect();
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn every_page_of_the_book_is_in_its_summary() {
    let src = repo().join("docs/src");
    let summary_path = src.join("SUMMARY.md");
    let summary = std::fs::read_to_string(&summary_path)
        .unwrap_or_else(|e| panic!("{}: {e}", summary_path.display()));
    let listed: BTreeSet<PathBuf> = prose_lines(&summary)
        .iter()
        .flat_map(|(_, line)| link_targets(line))
        .filter(|t| !t.is_empty() && !t.contains("://"))
        .map(|t| normalize(&src.join(t.split('#').next().unwrap())))
        .collect();
    let missing: Vec<String> = book_pages()
        .into_iter()
        .filter(|p| *p != summary_path && !listed.contains(p))
        .map(|p| relative(&p))
        .collect();
    assert!(
        missing.is_empty(),
        "pages not in docs/src/SUMMARY.md: {missing:?}"
    );
    let book = std::fs::read_to_string(repo().join("docs/book.toml")).unwrap();
    assert!(book.contains("[book]"), "docs/book.toml: {book}");
}

/// The lines between `<!-- NAME:begin -->` and `<!-- NAME:end -->`.
fn between_markers(text: &str, name: &str) -> Option<String> {
    let (_, after) = text.split_once(&format!("<!-- {name}:begin -->\n"))?;
    let (table, _) = after.split_once(&format!("<!-- {name}:end -->"))?;
    Some(table.to_string())
}

#[test]
fn readme_stage_table_is_generated_from_the_declarations() {
    let table = embodyflow_core::spec::markdown_table();
    let printed = run("pipeline", &["stages", "--markdown"]);
    assert_eq!(printed.code, 0, "{printed}");
    assert_eq!(printed.stdout, table);
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let documented = between_markers(&readme, "stages")
        .expect("README.md has <!-- stages:begin --> and <!-- stages:end --> lines");
    assert_eq!(
        documented, table,
        "README.md's stage table differs from the declarations: put the output of \
         `target/release/pipeline stages --markdown` between its markers"
    );
}

/// The table of the shipped pipelines that docs/src/runner.md holds: one
/// row per `pipelines/*.toml`, sorted by file name, with its `[pipeline]
/// description`.
fn shipped_pipelines_table() -> String {
    let mut files = Vec::new();
    files_under(&repo().join("pipelines"), ".toml", &mut files);
    let mut table = String::from("| file | what it runs |\n|---|---|\n");
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let parsed: toml::Table =
            toml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let description = parsed
            .get("pipeline")
            .and_then(|p| p.get("description"))
            .and_then(toml::Value::as_str)
            .unwrap_or_else(|| panic!("{} has no [pipeline] description", file.display()));
        table.push_str(&format!(
            "| `{}` | {} |\n",
            relative(&file),
            description.replace('|', "\\|")
        ));
    }
    table.push('\n');
    table
}

#[test]
fn the_runner_page_lists_every_shipped_pipeline() {
    let table = shipped_pipelines_table();
    assert!(table.lines().count() >= 2 + 11, "{table}");
    let page = std::fs::read_to_string(repo().join("docs/src/runner.md")).unwrap();
    let documented = between_markers(&page, "pipelines")
        .expect("docs/src/runner.md has <!-- pipelines:begin --> and <!-- pipelines:end --> lines");
    assert_eq!(
        documented, table,
        "docs/src/runner.md's table of the shipped pipelines differs from pipelines/*.toml: \
         put this between its markers:\n{table}"
    );
}

/// The lines of `text` (outside code blocks) that follow a table row
/// directly and are neither a row nor blank nor an HTML comment: mdBook
/// renders such a line as one more cell of the table, so the paragraph it
/// starts disappears into it.
fn swallowed_by_tables(text: &str) -> Vec<usize> {
    let lines = prose_lines(text);
    lines
        .windows(2)
        .filter(|pair| {
            let ((above, row), (n, line)) = (&pair[0], &pair[1]);
            let line = line.trim();
            *n == above + 1
                && row.trim_start().starts_with('|')
                && !line.is_empty()
                && !line.starts_with('|')
                && !line.starts_with("<!--")
        })
        .map(|pair| pair[1].0)
        .collect()
}

#[test]
fn no_paragraph_runs_into_a_table() {
    assert_eq!(
        swallowed_by_tables(
            "| a |\n|---|\n| 1 |\nafter\n\n| b |\n|---|\n\ntext\n```\n| x |\ny\n```\n"
        ),
        [4]
    );
    let found: Vec<String> = markdown_files()
        .iter()
        .flat_map(|file| {
            let text = std::fs::read_to_string(file).unwrap();
            swallowed_by_tables(&text)
                .into_iter()
                .map(|n| format!("{}:{n}", relative(file)))
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(
        found.is_empty(),
        "lines right after a table row, which mdBook renders inside the table \
         (put a blank line before them):\n{}",
        found.join("\n")
    );
}

#[test]
fn the_book_builds_with_mdbook() {
    let found = std::process::Command::new("mdbook")
        .arg("--version")
        .output();
    if !found.is_ok_and(|o| o.status.success()) {
        eprintln!(
            "note: mdbook is not on the PATH (`cargo install mdbook --locked`): the book was not built"
        );
        return;
    }
    let out = tempfile::tempdir().unwrap();
    let built = std::process::Command::new("mdbook")
        .arg("build")
        .arg(repo().join("docs"))
        .arg("--dest-dir")
        .arg(out.path())
        .output()
        .expect("run mdbook");
    let stderr = String::from_utf8_lossy(&built.stderr);
    assert!(built.status.success(), "mdbook build docs:\n{stderr}");
    assert!(out.path().join("index.html").is_file());
}

/// Words that tell how the project was developed rather than what it is:
/// a word followed by a number (`issue 27`, `Issue #27`), or a phrase.
const HISTORY_NUMBERED: [&str; 4] = ["session", "round", "issue", "issues"];
const HISTORY_PHRASES: [&str; 2] = ["since session", "measured in round"];

/// The development-history words of `text`, as `line: words`.
fn history_words(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let lower = line.to_lowercase();
        for phrase in HISTORY_PHRASES {
            if lower.contains(phrase) {
                found.push(format!("{}: `{phrase}`", n + 1));
            }
        }
        for word in HISTORY_NUMBERED {
            for (at, _) in lower.match_indices(word) {
                let before = lower[..at].chars().next_back();
                if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                    continue;
                }
                let after = &lower[at + word.len()..];
                let Some(number) = after.strip_prefix(' ') else {
                    continue;
                };
                let number = number.strip_prefix('#').unwrap_or(number);
                if number.starts_with(|c: char| c.is_ascii_digit()) {
                    let end = number
                        .find(|c: char| !c.is_ascii_digit())
                        .unwrap_or(number.len());
                    found.push(format!("{}: `{word} {}`", n + 1, &number[..end]));
                }
            }
        }
    }
    found
}

#[test]
fn history_words_are_found_as_words_with_numbers() {
    let text = "Since session 14 the bridge polls\nfixed in Issue #27; issues 15 and 17\n\
                rounds 3, round-trip 2, session_4, around 5\nmeasured in round two\n";
    assert_eq!(
        history_words(text),
        [
            "1: `since session`",
            "1: `session 14`",
            "2: `issue 27`",
            "2: `issues 15`",
            "4: `measured in round`",
        ]
    );
}

#[test]
fn no_file_speaks_of_how_the_project_was_developed() {
    let root = repo();
    let mut files = markdown_files();
    for dir in ["stages", "schemas", "scripts", "tests", "pipelines"] {
        files_under(&root.join(dir), "", &mut files);
    }
    assert!(
        files.iter().any(|f| f.ends_with("stages/core/src/spec.rs")),
        "the walk missed the sources"
    );
    let mut found = Vec::new();
    for file in &files {
        // This file holds the list itself.
        if file.ends_with(file!()) {
            continue;
        }
        // Binary files (fixtures, images) hold no prose.
        let Ok(text) = std::fs::read_to_string(file) else {
            continue;
        };
        for hit in history_words(&text) {
            found.push(format!("{}:{hit}", relative(file)));
        }
    }
    assert!(
        found.is_empty(),
        "development history in {} place(s):\n{}",
        found.len(),
        found.join("\n")
    );
}

#[test]
fn links_are_read_outside_code_and_checked_inside_the_repository() {
    let line = "see [the book](docs/src/SUMMARY.md#top \"title\"), ![a curve](results/x.png), \
                `[not](a-link.md)` and <img src=\"logo.png\">";
    let (_, prose) = &prose_lines(line)[0];
    assert_eq!(
        link_targets(prose),
        ["docs/src/SUMMARY.md#top", "results/x.png", "logo.png"]
    );
    assert_eq!(
        link_targets("[design]: docs/src/design.md"),
        ["docs/src/design.md"]
    );
    let text = "# The `table` tool\n```sh\n# not a heading\n```\n## Sharding, and merging\n## Sharding, and merging\n";
    assert_eq!(
        anchors(text).into_iter().collect::<Vec<_>>(),
        [
            "sharding-and-merging",
            "sharding-and-merging-1",
            "the-table-tool"
        ]
    );
    let readme = repo().join("README.md");
    let text = "[design](../shared/DESIGN.md) [tests](tests/) [gone](no/such.md) \
                [self](#no-such-heading) [ok](#the-table-tool)\n# The `table` tool\n";
    let broken = broken_links(&readme, text);
    assert_eq!(broken.len(), 3, "{broken:?}");
    assert!(broken[0].contains("outside the repository"), "{broken:?}");
    assert!(broken[1].contains("no such file no/such.md"), "{broken:?}");
    assert!(broken[2].contains("anchor #no-such-heading"), "{broken:?}");
}
