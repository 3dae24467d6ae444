//! Mechanical checks of the rules in `docs/architecture.md`.
//!
//! Each check returns the [`Violation`]s it found; [`check`] runs them all and [`run`]
//! turns any violation into an error that names the rule and where it broke. The same
//! checks run as plain tests (`xtask/tests/tidy.rs`), so `cargo test --workspace`
//! enforces them too.
//!
//! | rule | what it checks |
//! |------|----------------|
//! | `core-isolated` | `intercept-core`'s normal dependency tree has no hyper crate, no sibling `intercept-*` crate, and no tokio with the `net`, `process` or `full` features |
//! | `one-way-deps` | dependencies point one way: the server and the tunnels never depend on each other, on the pool or on the cli; the pool never on the cli |
//! | `server-names-no-tunnel` | `intercept-server`'s manifest names no `intercept-tunnel` dependency of any kind (not even for tests) |
//! | `fakes-stay-in-tests` | no publishable crate, nor the `intercept` binary's crate, has a normal dependency on the unpublished fakes (`intercept-test`) |
//! | `workspace-deps-used` | every entry of the root `[workspace.dependencies]` is a dependency of some member (cargo-machete checks the members' own lists) |
//! | `no-placeholders` | no placeholder macros or ignored tests in the Rust sources under `crates/`, `xtask/` and `tests/` |
//! | `workspace-lints` | every member's `Cargo.toml` has `[lints] workspace = true` |
//! | `crate-docs` | every member's library root (`src/lib.rs`) starts with a `//!` crate doc |
//! | `code-map` | every `src/*.rs` file (but `lib.rs`) and module folder of a library crate under `crates/` is named in that crate's section of `docs/architecture.md`, and every name that page writes in backticks as code (an identifier, a path `a::b`, a call `f()`) is in the sources (`NOT_CODE` lists the words that are not code) |
//! | `module-cycles` | in every library crate under `crates/`, the modules of each folder (the root's modules, a module's submodules) use each other one way: the paths the code writes outside comments, literals and `#[cfg(test)]` items, resolved through `use` re-exports to the module that holds their target, make no cycle (see [`ModuleTree`]) |
//! | `timeless-docs` | `docs/*.md` and the READMEs never say "being built", "today", "comes later" or "for now": a page says what the code does |

use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _, Result};

use crate::{capture, cargo, metadata, packages};

mod modules;
pub use modules::{graph_cycles, Cycle, ModuleTree};

/// One broken rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The rule's name (see the table in this module's docs).
    pub rule: &'static str,
    /// Where: a crate, a manifest or `file:line`.
    pub location: String,
    /// What is wrong and what to do about it.
    pub detail: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{}] {}: {}", self.rule, self.location, self.detail)
    }
}

/// Runs every check; fails with a list of the violations, one per line.
pub fn run(root: &Path) -> Result<()> {
    let violations = check(root)?;
    if violations.is_empty() {
        println!("tidy: all rules hold");
        return Ok(());
    }
    bail!("{}", report(&violations))
}

/// Formats violations as an error message.
pub fn report(violations: &[Violation]) -> String {
    let mut out = format!("tidy found {} problem(s):", violations.len());
    for v in violations {
        out.push_str("\n  ");
        out.push_str(&v.to_string());
    }
    out
}

/// Runs every check and returns what broke. An `Err` means a check could not run at all
/// (cargo failed, a file could not be read), not that a rule broke.
pub fn check(root: &Path) -> Result<Vec<Violation>> {
    let mut all = Vec::new();
    all.extend(core_isolated(root)?);
    all.extend(one_way_deps(root)?);
    all.extend(manifest_rules(root)?);
    all.extend(workspace_deps_used(root)?);
    all.extend(no_placeholders(root)?);
    all.extend(code_map(root)?);
    all.extend(module_cycles(root)?);
    all.extend(timeless_docs(root)?);
    Ok(all)
}

/// One package in a `cargo tree` listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeEntry {
    /// Package name.
    pub name: String,
    /// Package version as printed (`v1.2.3`).
    pub version: String,
    /// Enabled features of the package.
    pub features: Vec<String>,
}

/// The normal (non-dev, non-build) dependency tree of a workspace package, for every
/// target platform, with the features each package is built with when that package is
/// built alone. The first entry is the package itself.
pub fn normal_tree(root: &Path, package: &str) -> Result<Vec<TreeEntry>> {
    let out = capture(
        cargo()
            .args(["tree", "-p", package, "-e", "normal", "--target", "all"])
            .args(["--prefix", "none", "--format", "{p}|{f}"])
            .current_dir(root),
    )
    .with_context(|| format!("could not list the dependency tree of {package}"))?;
    Ok(parse_tree(&out))
}

/// Parses `cargo tree --prefix none --format '{p}|{f}'` output.
pub fn parse_tree(out: &str) -> Vec<TreeEntry> {
    out.lines()
        .filter_map(|line| {
            let (package, features) = line.split_once('|')?;
            let mut words = package.split_whitespace();
            let name = words.next()?.to_owned();
            let version = words.next().unwrap_or_default().to_owned();
            let features = features
                .trim()
                .trim_end_matches("(*)")
                .split(',')
                .map(str::trim)
                .filter(|f| !f.is_empty())
                .map(str::to_owned)
                .collect();
            Some(TreeEntry {
                name,
                version,
                features,
            })
        })
        .collect()
}

const CORE: &str = "intercept-core";

/// Tokio features that give a crate sockets or child processes (`full` implies both).
const TOKIO_IO_FEATURES: &[&str] = &["net", "process", "full"];

/// `core-isolated`: see the module docs.
pub fn core_isolated(root: &Path) -> Result<Vec<Violation>> {
    Ok(core_violations(&normal_tree(root, CORE)?))
}

/// The `core-isolated` rule applied to a listing of `intercept-core`'s tree.
pub fn core_violations(tree: &[TreeEntry]) -> Vec<Violation> {
    let mut out = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for entry in tree.iter().skip(1) {
        if !seen.insert((entry.name.clone(), entry.version.clone())) {
            continue;
        }
        let location = format!("{CORE} -> {} {}", entry.name, entry.version);
        if entry.name == "hyper" || entry.name.starts_with("hyper-") {
            out.push(Violation {
                rule: "core-isolated",
                location,
                detail: "intercept-core must not pull an HTTP stack; move the code that needs \
                         it to intercept-server"
                    .into(),
            });
        } else if entry.name.starts_with("intercept-") {
            out.push(Violation {
                rule: "core-isolated",
                location,
                detail: "intercept-core is the bottom layer and depends on no sibling crate".into(),
            });
        } else if entry.name == "tokio" {
            let io: Vec<&str> = TOKIO_IO_FEATURES
                .iter()
                .copied()
                .filter(|f| entry.features.iter().any(|e| e == f))
                .collect();
            if !io.is_empty() {
                out.push(Violation {
                    rule: "core-isolated",
                    location,
                    detail: format!(
                        "intercept-core does no I/O, but tokio is built with feature(s) {}",
                        io.join(", ")
                    ),
                });
            }
        }
    }
    out
}

/// Which sibling crates each layer must never reach through its normal dependencies.
pub const FORBIDDEN: &[(&str, &[&str])] = &[
    (
        "intercept-server",
        &["intercept-tunnel", "intercept-pool", "intercept-cli"],
    ),
    (
        "intercept-tunnel",
        &["intercept-server", "intercept-pool", "intercept-cli"],
    ),
    ("intercept-pool", &["intercept-cli"]),
    // The benches run the binary; they take what they share with it (the allocator, the
    // record, the mock and its harness client) from the crates that hold it.
    ("intercept-bench", &["intercept-cli"]),
    ("intercept-mock", &["intercept-cli"]),
];

/// Crates not published to crates.io but shipped all the same (the `intercept` binary):
/// `fakes-stay-in-tests` holds them like the publishable ones.
pub const SHIPPED: &[&str] = &["intercept-cli"];

/// `one-way-deps` and `fakes-stay-in-tests`: see the module docs.
pub fn one_way_deps(root: &Path) -> Result<Vec<Violation>> {
    let meta = metadata(root)?;
    let mut out = Vec::new();
    for pkg in packages(&meta) {
        let Some(name) = pkg.get("name").and_then(|n| n.as_str()) else {
            continue;
        };
        // intercept-core is covered by `core-isolated`, which forbids every sibling.
        if !name.starts_with("intercept-") || name == CORE {
            continue;
        }
        let forbidden = FORBIDDEN
            .iter()
            .find(|(layer, _)| *layer == name)
            .map(|(_, f)| *f)
            .unwrap_or(&[]);
        let publishable = is_publishable(pkg) || SHIPPED.contains(&name);
        if forbidden.is_empty() && !publishable {
            continue;
        }
        let tree = normal_tree(root, name)?;
        let mut reported = std::collections::BTreeSet::new();
        for entry in tree.iter().skip(1) {
            if !reported.insert(entry.name.clone()) {
                continue;
            }
            if forbidden.contains(&entry.name.as_str()) {
                out.push(Violation {
                    rule: "one-way-deps",
                    location: format!("{name} -> {}", entry.name),
                    detail: format!(
                        "dependencies point one way (core <- server, core <- tunnel, \
                         (server, tunnel) <- pool <- cli); {name} must not depend on {}",
                        entry.name
                    ),
                });
            }
            if publishable && entry.name == "intercept-test" {
                out.push(Violation {
                    rule: "fakes-stay-in-tests",
                    location: format!("{name} -> intercept-test"),
                    detail: format!(
                        "{name} is shipped but has a normal dependency on the unpublished \
                         fakes; make it a dev-dependency (the mock model is intercept-mock)"
                    ),
                });
            }
        }
    }
    Ok(out)
}

/// Whether a `cargo metadata` package may be published (`publish` is `null`, or a
/// non-empty list of registries).
fn is_publishable(pkg: &serde_json::Value) -> bool {
    match pkg.get("publish") {
        None | Some(serde_json::Value::Null) => true,
        Some(serde_json::Value::Array(registries)) => !registries.is_empty(),
        Some(_) => true,
    }
}

/// `server-names-no-tunnel`, `workspace-lints` and `crate-docs`: see the module docs.
pub fn manifest_rules(root: &Path) -> Result<Vec<Violation>> {
    let meta = metadata(root)?;
    let mut out = Vec::new();
    for pkg in packages(&meta) {
        let name = pkg.get("name").and_then(|n| n.as_str()).unwrap_or("?");
        let Some(manifest) = pkg.get("manifest_path").and_then(|m| m.as_str()) else {
            continue;
        };
        let manifest = PathBuf::from(manifest);
        let shown = relative(root, &manifest);

        if name == "intercept-server" {
            for dep in pkg
                .get("dependencies")
                .and_then(|d| d.as_array())
                .into_iter()
                .flatten()
            {
                if dep.get("name").and_then(|n| n.as_str()) == Some("intercept-tunnel") {
                    let kind = dep.get("kind").and_then(|k| k.as_str()).unwrap_or("normal");
                    out.push(Violation {
                        rule: "server-names-no-tunnel",
                        location: shown.clone(),
                        detail: format!(
                            "intercept-server has a {kind} dependency on intercept-tunnel; the \
                             server holds a `dyn Tunnel` from intercept-core and never names \
                             a backend (tests use the fake tunnel of intercept-test)"
                        ),
                    });
                }
            }
        }

        let text = fs::read_to_string(&manifest)
            .with_context(|| format!("could not read {}", manifest.display()))?;
        if !has_workspace_lints(&text) {
            out.push(Violation {
                rule: "workspace-lints",
                location: shown.clone(),
                detail: "add `[lints]` with `workspace = true` so the workspace lints apply".into(),
            });
        }

        for target in pkg
            .get("targets")
            .and_then(|t| t.as_array())
            .into_iter()
            .flatten()
        {
            let is_lib = target
                .get("kind")
                .and_then(|k| k.as_array())
                .is_some_and(|k| {
                    k.iter().any(|k| {
                        matches!(
                            k.as_str(),
                            Some("lib" | "rlib" | "dylib" | "cdylib" | "staticlib" | "proc-macro")
                        )
                    })
                });
            let Some(src) = target.get("src_path").and_then(|s| s.as_str()) else {
                continue;
            };
            if !is_lib {
                continue;
            }
            let src = PathBuf::from(src);
            let text = match fs::read_to_string(&src) {
                Ok(text) => text,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    out.push(Violation {
                        rule: "crate-docs",
                        location: relative(root, &src),
                        detail: format!("{name}'s library root does not exist"),
                    });
                    continue;
                }
                Err(e) => {
                    return Err(e).with_context(|| format!("could not read {}", src.display()))
                }
            };
            if !starts_with_crate_doc(&text) {
                out.push(Violation {
                    rule: "crate-docs",
                    location: format!("{}:1", relative(root, &src)),
                    detail: format!(
                        "{name}'s library root must open with a `//!` doc saying what the \
                         crate is for"
                    ),
                });
            }
        }
    }
    Ok(out)
}

/// `workspace-deps-used`: see the module docs.
pub fn workspace_deps_used(root: &Path) -> Result<Vec<Violation>> {
    let manifest = root.join("Cargo.toml");
    let text = fs::read_to_string(&manifest)
        .with_context(|| format!("could not read {}", manifest.display()))?;
    let meta = metadata(root)?;
    let mut used = Vec::new();
    for pkg in packages(&meta) {
        for dep in pkg
            .get("dependencies")
            .and_then(|d| d.as_array())
            .into_iter()
            .flatten()
        {
            let name = dep
                .get("rename")
                .and_then(|r| r.as_str())
                .or_else(|| dep.get("name").and_then(|n| n.as_str()));
            used.extend(name.map(str::to_owned));
        }
    }
    Ok(unused_workspace_deps(&text, &used)
        .into_iter()
        .map(|name| Violation {
            rule: "workspace-deps-used",
            location: "Cargo.toml".into(),
            detail: format!(
                "`{name}` is in [workspace.dependencies] but no member depends on it: \
                 remove it"
            ),
        })
        .collect())
}

/// The keys of a root manifest's `[workspace.dependencies]` table that are not in `used`.
pub fn unused_workspace_deps(root_manifest: &str, used: &[String]) -> Vec<String> {
    let mut in_table = false;
    let mut out = Vec::new();
    for line in root_manifest.lines() {
        let line = strip_comment(line).trim();
        if line.starts_with('[') {
            let table: String = line
                .trim_matches(|c| c == '[' || c == ']')
                .chars()
                .filter(|c| !c.is_whitespace())
                .collect();
            in_table = table == "workspace.dependencies";
            continue;
        }
        if !in_table {
            continue;
        }
        let Some((key, _)) = line.split_once('=') else {
            continue;
        };
        let key = key.trim();
        let key = key
            .strip_suffix(".workspace")
            .unwrap_or(key)
            .trim_matches('"');
        if !key.is_empty() && !used.iter().any(|u| u == key) {
            out.push(key.to_owned());
        }
    }
    out
}

#[cfg(test)]
mod workspace_deps_tests {
    use super::unused_workspace_deps;

    #[test]
    fn unused_workspace_entries_are_named() {
        let manifest = "[workspace]\nmembers = [\"a\"]\n\n[workspace.dependencies]\n\
                        # a comment = 1\nserde = { version = \"1\", features = [\"derive\"] }\n\
                        reqwest = \"0.13\" # unused\n\n[workspace.lints.rust]\nunsafe_code = \"deny\"\n";
        let used = vec!["serde".to_owned()];
        assert_eq!(unused_workspace_deps(manifest, &used), vec!["reqwest"]);
        let used = vec!["serde".to_owned(), "reqwest".to_owned()];
        assert!(unused_workspace_deps(manifest, &used).is_empty());
    }
}

/// Whether a manifest opts into the workspace lints: a `[lints]` table with
/// `workspace = true`, or `lints.workspace = true` / `lints = { workspace = true }` in
/// the root table.
pub fn has_workspace_lints(manifest: &str) -> bool {
    let mut table = String::new();
    for line in manifest.lines() {
        let line = strip_comment(line).trim();
        if line.is_empty() {
            continue;
        }
        if line.starts_with('[') {
            table = line
                .trim_matches(|c| c == '[' || c == ']')
                .chars()
                .filter(|c| !c.is_whitespace())
                .collect();
            continue;
        }
        let compact: String = line.chars().filter(|c| !c.is_whitespace()).collect();
        let holds = match table.as_str() {
            "lints" => compact == "workspace=true",
            "" => compact == "lints.workspace=true" || compact == "lints={workspace=true}",
            _ => false,
        };
        if holds {
            return true;
        }
    }
    false
}

/// A TOML line without its trailing comment (a `#` outside a string).
fn strip_comment(line: &str) -> &str {
    let mut in_string: Option<char> = None;
    for (i, c) in line.char_indices() {
        match (in_string, c) {
            (None, '#') => return &line[..i],
            (None, '"' | '\'') => in_string = Some(c),
            (Some(q), c) if c == q => in_string = None,
            _ => {}
        }
    }
    line
}

/// Whether a source file's first non-blank line is a `//!` doc comment.
pub fn starts_with_crate_doc(source: &str) -> bool {
    source
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .is_some_and(|l| l.starts_with("//!"))
}

/// The folders whose Rust sources [`no_placeholders`] reads.
pub const SOURCE_DIRS: &[&str] = &["crates", "xtask", "tests"];

/// What [`no_placeholders`] looks for, spelt in pieces so that this file does not
/// contain them.
fn placeholders() -> [(String, &'static str); 3] {
    [
        (
            ["todo", "!("].concat(),
            "unfinished code: finish it, or return an error that says what is missing",
        ),
        (
            ["unimplemented", "!("].concat(),
            "unfinished code: finish it, or return an error that says what is missing",
        ),
        (
            ["#[", "ignore"].concat(),
            "ignored test: make it pass deterministically or delete it",
        ),
    ]
}

/// `no-placeholders`: see the module docs.
pub fn no_placeholders(root: &Path) -> Result<Vec<Violation>> {
    let mut files = Vec::new();
    for dir in SOURCE_DIRS {
        let dir = root.join(dir);
        if dir.is_dir() {
            rust_files(&dir, &mut files)?;
        }
    }
    files.sort();
    let mut out = Vec::new();
    for file in files {
        let text = fs::read_to_string(&file)
            .with_context(|| format!("could not read {}", file.display()))?;
        for (line, pattern, detail) in find_placeholders(&text) {
            out.push(Violation {
                rule: "no-placeholders",
                location: format!("{}:{line}", relative(root, &file)),
                detail: format!("`{pattern}`: {detail}"),
            });
        }
    }
    Ok(out)
}

/// The placeholders in one source text: (1-based line, pattern, advice).
pub fn find_placeholders(source: &str) -> Vec<(usize, String, &'static str)> {
    let patterns = placeholders();
    let mut out = Vec::new();
    for (i, line) in source.lines().enumerate() {
        for (pattern, detail) in &patterns {
            if line.contains(pattern.as_str()) {
                out.push((i + 1, pattern.clone(), *detail));
            }
        }
    }
    out
}

/// The page whose code map [`code_map`] checks.
pub const ARCHITECTURE: &str = "docs/architecture.md";

/// `code-map`: see the module docs.
pub fn code_map(root: &Path) -> Result<Vec<Violation>> {
    let page_path = root.join(ARCHITECTURE);
    let page = fs::read_to_string(&page_path)
        .with_context(|| format!("could not read {}", page_path.display()))?;
    let crates = root.join("crates");
    let mut dirs: Vec<PathBuf> = fs::read_dir(&crates)
        .with_context(|| format!("could not list {}", crates.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("src/lib.rs").is_file())
        .collect();
    dirs.sort();
    let mut out = Vec::new();
    for dir in dirs {
        let name = dir
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        let mut entries: Vec<(String, bool)> = fs::read_dir(dir.join("src"))
            .with_context(|| format!("could not list {}/src", dir.display()))?
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let file = e.file_name().to_string_lossy().into_owned();
                let is_dir = e.file_type().ok()?.is_dir();
                (is_dir || file.ends_with(".rs")).then_some((file, is_dir))
            })
            .collect();
        entries.sort();
        out.extend(code_map_violations(&page, &name, &entries));
    }
    out.extend(code_map_names(root, &page)?);
    Ok(out)
}

/// Words the architecture page writes in backticks that name no code.
pub const NOT_CODE: &[&str] = &[];

/// The folders whose sources the page's names are looked up in.
const NAME_SOURCES: &[&str] = &["crates", "xtask", "tests", "python"];

/// The second half of `code-map`: every name the page writes in backticks that reads as
/// code (an identifier, a path `a::b`, a call `f()`) is in the sources: each segment a
/// word of a line of Rust or Python outside comments, a call's name a `fn` or `def`.
fn code_map_names(root: &Path, page: &str) -> Result<Vec<Violation>> {
    let mut words = std::collections::HashSet::new();
    let mut functions = std::collections::HashSet::new();
    for dir in NAME_SOURCES {
        let mut files = Vec::new();
        source_files(&root.join(dir), &mut files)?;
        for file in files {
            let text = fs::read_to_string(&file)
                .with_context(|| format!("could not read {}", file.display()))?;
            source_words(&text, &mut words, &mut functions);
        }
    }
    Ok(missing_names(page, &words, &functions)
        .into_iter()
        .map(|(line, name)| Violation {
            rule: "code-map",
            location: format!("{ARCHITECTURE}:{line}"),
            detail: format!(
                "`{name}` names nothing in the sources: write the name the code uses, or drop it"
            ),
        })
        .collect())
}

/// The words of a source's lines outside comments (`//`, `#`), and the names its `fn`s
/// and `def`s define.
pub fn source_words(
    text: &str,
    words: &mut std::collections::HashSet<String>,
    functions: &mut std::collections::HashSet<String>,
) {
    for line in text.lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("//") || trimmed.starts_with('#') && !trimmed.starts_with("#[") {
            continue;
        }
        let mut previous = "";
        for word in line
            .split(|c: char| !(c.is_alphanumeric() || c == '_'))
            .filter(|w| !w.is_empty())
        {
            if previous == "fn" || previous == "def" {
                functions.insert(word.to_string());
            }
            words.insert(word.to_string());
            previous = word;
        }
    }
}

/// The backticked names of `page` (outside fenced blocks) that read as code but are not
/// among `words` (or, for a call, `functions`), with their 1-based lines.
pub fn missing_names(
    page: &str,
    words: &std::collections::HashSet<String>,
    functions: &std::collections::HashSet<String>,
) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut fenced = false;
    for (i, line) in page.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        for (k, span) in line.split('`').enumerate() {
            if k % 2 == 0 || NOT_CODE.contains(&span) {
                continue;
            }
            let call = span.ends_with("()");
            let path = span.strip_suffix("()").unwrap_or(span);
            let ident = |s: &str| {
                s.chars()
                    .next()
                    .is_some_and(|c| c.is_alphabetic() || c == '_')
                    && s.chars().all(|c| c.is_alphanumeric() || c == '_')
            };
            let segments: Vec<&str> = path.split("::").collect();
            if !segments.iter().all(|s| ident(s)) {
                continue;
            }
            let last = segments.last().copied().unwrap_or_default();
            let missing =
                segments.iter().any(|s| !words.contains(*s)) || (call && !functions.contains(last));
            if missing {
                out.push((i + 1, span.to_string()));
            }
        }
    }
    out
}

/// Every `.rs` and `.py` file under `dir`, skipping `target` and hidden folders.
fn source_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    files_ending(dir, &[".rs", ".py"], out)
}

/// Every file under `dir` whose name ends with one of `endings`, skipping `target` and
/// hidden folders.
fn files_ending(dir: &Path, endings: &[&str], out: &mut Vec<PathBuf>) -> Result<()> {
    let entries = fs::read_dir(dir).with_context(|| format!("could not list {}", dir.display()))?;
    for entry in entries {
        let entry = entry.with_context(|| format!("could not list {}", dir.display()))?;
        let path = entry.path();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let kind = entry
            .file_type()
            .with_context(|| format!("could not stat {}", path.display()))?;
        if kind.is_dir() {
            if name != "target" && !name.starts_with('.') {
                files_ending(&path, endings, out)?;
            }
        } else if kind.is_file() && endings.iter().any(|e| name.ends_with(e)) {
            out.push(path);
        }
    }
    Ok(())
}

/// The `code-map` rule for one crate: `entries` are its `src/` entries (name, is a
/// folder). A file is named as `` `name.rs` ``, a folder as `` `name/`` (the folder or a
/// file in it), inside the crate's `` ### `crates/<crate>` `` section.
pub fn code_map_violations(page: &str, krate: &str, entries: &[(String, bool)]) -> Vec<Violation> {
    let location = format!("{ARCHITECTURE} (crates/{krate})");
    let Some(section) = crate_section(page, krate) else {
        return vec![Violation {
            rule: "code-map",
            location,
            detail: format!("no `### `crates/{krate}`` section: add one to the code map"),
        }];
    };
    entries
        .iter()
        .filter(|(file, is_dir)| *is_dir || file != "lib.rs")
        .filter(|(file, is_dir)| {
            let needle = if *is_dir {
                format!("`{file}/")
            } else {
                format!("`{file}`")
            };
            !section.contains(&needle)
        })
        .map(|(file, is_dir)| Violation {
            rule: "code-map",
            location: location.clone(),
            detail: format!(
                "src/{file}{} is not named in the crate's code map: say in a line what it holds",
                if *is_dir { "/" } else { "" }
            ),
        })
        .collect()
}

/// The text of a crate's section: from its `###` heading to the next heading.
fn crate_section<'a>(page: &'a str, krate: &str) -> Option<&'a str> {
    let heading = format!("### `crates/{krate}`");
    let start = page.find(&heading)? + heading.len();
    let rest = &page[start..];
    let end = rest
        .match_indices("\n#")
        .map(|(i, _)| i)
        .next()
        .unwrap_or(rest.len());
    Some(&rest[..end])
}

/// `module-cycles`: see the module docs. Every crate under `crates/` with a library
/// (`src/lib.rs`) is checked; finding none is an error, not a pass.
pub fn module_cycles(root: &Path) -> Result<Vec<Violation>> {
    let mut out = Vec::new();
    let crates = library_crates(root)?;
    if crates.is_empty() {
        bail!(
            "no library crate under {}/crates to check for module cycles",
            root.display()
        );
    }
    for name in crates {
        for cycle in crate_modules(root, &name)?.cycles() {
            out.push(Violation {
                rule: "module-cycles",
                location: format!("crates/{name}"),
                detail: format!(
                    "its modules use each other in a cycle ({}{}): make the dependency one-way (move what creates the edge back into the module that owns it, or into a module of its own)",
                    cycle.path.join(" → "),
                    if cycle.tangle.len() + 1 > cycle.path.len() {
                        format!("; {} all reach each other", cycle.tangle.join(", "))
                    } else {
                        String::new()
                    }
                ),
            });
        }
    }
    Ok(out)
}

/// The names of the crates under `crates/` that have a library (`src/lib.rs`), sorted.
pub fn library_crates(root: &Path) -> Result<Vec<String>> {
    let crates = root.join("crates");
    let mut names: Vec<String> = fs::read_dir(&crates)
        .with_context(|| format!("could not list {}", crates.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("src/lib.rs").is_file())
        .filter_map(|p| Some(p.file_name()?.to_string_lossy().into_owned()))
        .collect();
    names.sort();
    Ok(names)
}

/// The module tree of the library crate `crates/<name>`, read from its `src/` files.
pub fn crate_modules(root: &Path, name: &str) -> Result<ModuleTree> {
    let src = root.join("crates").join(name).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files)?;
    files.sort();
    let mut sources = Vec::new();
    for file in files {
        let rel = file.strip_prefix(&src).unwrap_or(&file);
        let text = fs::read_to_string(&file)
            .with_context(|| format!("could not read {}", file.display()))?;
        sources.push((rel.to_string_lossy().into_owned(), text));
    }
    Ok(ModuleTree::read(&sources))
}

/// Words that date a page: what it says must be what the code does.
pub const DATED_PHRASES: &[&str] = &["being built", "today", "comes later", "for now"];

/// `timeless-docs`: see the module docs.
pub fn timeless_docs(root: &Path) -> Result<Vec<Violation>> {
    let mut files = vec![root.join("README.md"), root.join("python/README.md")];
    let docs = root.join("docs");
    let mut pages: Vec<PathBuf> = fs::read_dir(&docs)
        .with_context(|| format!("could not list {}", docs.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    pages.sort();
    files.extend(pages);
    let mut out = Vec::new();
    for file in files.into_iter().filter(|f| f.is_file()) {
        let text = fs::read_to_string(&file)
            .with_context(|| format!("could not read {}", file.display()))?;
        for (line, phrase) in find_dated_phrases(&text) {
            out.push(Violation {
                rule: "timeless-docs",
                location: format!("{}:{line}", relative(root, &file)),
                detail: format!(
                    "\"{phrase}\": say what the code does (or measured, and when), not where it stands"
                ),
            });
        }
    }
    Ok(out)
}

/// The dated phrases of a text as (1-based line, phrase), matched case-insensitively as
/// whole words (`today's` counts, `todays_value` does not).
pub fn find_dated_phrases(text: &str) -> Vec<(usize, &'static str)> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let lower = line.to_lowercase();
        for phrase in DATED_PHRASES {
            let hit = lower.match_indices(phrase).any(|(at, _)| {
                let before = lower[..at].chars().next_back();
                let after = lower[at + phrase.len()..].chars().next();
                let word = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
                !word(before) && !word(after)
            });
            if hit {
                out.push((i + 1, *phrase));
            }
        }
    }
    out
}

/// Every `.rs` file under `dir`, skipping `target` and hidden folders.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    files_ending(dir, &[".rs"], out)
}

fn relative(root: &Path, path: &Path) -> String {
    path.strip_prefix(root)
        .unwrap_or(path)
        .display()
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &str, features: &[&str]) -> TreeEntry {
        TreeEntry {
            name: name.into(),
            version: "v1.0.0".into(),
            features: features.iter().map(|f| (*f).to_owned()).collect(),
        }
    }

    #[test]
    fn tree_lines_parse_with_features_and_dedup_marks() {
        let out = "intercept-core v0.1.0 (/w/crates/intercept-core)|\n\
                   tokio v1.48.0|bytes,default,net,rt (*)\n\
                   async-trait v0.1.92 (proc-macro)|\n";
        let tree = parse_tree(out);
        assert_eq!(tree.len(), 3);
        assert_eq!(tree[0].name, "intercept-core");
        assert_eq!(tree[1], {
            let mut e = entry("tokio", &["bytes", "default", "net", "rt"]);
            e.version = "v1.48.0".into();
            e
        });
        assert_eq!(tree[2].name, "async-trait");
        assert!(tree[2].features.is_empty());
    }

    #[test]
    fn core_rule_flags_hyper_siblings_and_tokio_io() {
        let clean = [
            entry("intercept-core", &[]),
            entry("tokio", &["rt", "sync", "macros"]),
            entry("http", &["std"]),
        ];
        assert!(core_violations(&clean).is_empty());

        let dirty = [
            entry("intercept-core", &[]),
            entry("hyper", &[]),
            entry("hyper-util", &[]),
            entry("intercept-server", &[]),
            entry("tokio", &["rt", "net"]),
            entry("tokio", &["rt", "net"]),
        ];
        let v = core_violations(&dirty);
        assert_eq!(v.len(), 4, "{v:?}");
        assert!(v.iter().all(|v| v.rule == "core-isolated"));
        assert!(v[3].detail.contains("net"), "{}", v[3]);
        let full = [entry("intercept-core", &[]), entry("tokio", &["full"])];
        assert_eq!(core_violations(&full).len(), 1);
    }

    #[test]
    fn workspace_lints_are_found_in_each_spelling() {
        assert!(has_workspace_lints(
            "[package]\nname = \"a\"\n\n[lints]\nworkspace = true\n"
        ));
        assert!(has_workspace_lints(
            "[ lints ]\n  workspace=true # shared\n"
        ));
        assert!(has_workspace_lints(
            "lints.workspace = true\n[package]\nname = \"a\"\n"
        ));
        assert!(has_workspace_lints("lints = { workspace = true }\n"));
        assert!(!has_workspace_lints("[package]\nworkspace = true\n"));
        assert!(!has_workspace_lints("[lints]\n# workspace = true\n"));
        assert!(!has_workspace_lints(
            "[lints.rust]\nworkspace = true\n[dependencies]\n"
        ));
        assert!(!has_workspace_lints("[package]\nname = \"a\"\n"));
    }

    #[test]
    fn crate_docs_must_come_first() {
        assert!(starts_with_crate_doc("//! What it is.\n\nmod a;\n"));
        assert!(starts_with_crate_doc("\n  //! Indented.\n"));
        assert!(!starts_with_crate_doc("// plain comment\n//! doc\n"));
        assert!(!starts_with_crate_doc("fn main() {}\n"));
        assert!(!starts_with_crate_doc(""));
    }

    #[test]
    fn placeholders_are_found_with_their_lines() {
        let todo = ["to", "do!()"].concat();
        let ignore = ["#[ig", "nore]"].concat();
        let unimpl = ["unimpl", "emented!(\"x\")"].concat();
        let src = format!("fn a() {{ {todo} }}\nfn b() {{}}\n{ignore}\nfn c() {{ {unimpl} }}\n");
        let found: Vec<usize> = find_placeholders(&src).iter().map(|f| f.0).collect();
        assert_eq!(found, vec![1, 3, 4]);
        assert!(find_placeholders("fn todo() {}\n// ignored\n").is_empty());
    }

    #[test]
    fn backticked_names_must_be_in_the_sources() {
        let mut words = std::collections::HashSet::new();
        let mut functions = std::collections::HashSet::new();
        source_words(
            "mod preamble;\npub fn read_body() {}\n// fn parse_body() in a comment\nstruct Shared;\ndef hook(): pass\n",
            &mut words,
            &mut functions,
        );
        let page = "`read_body` and `preamble::Shared`, `hook()`, `x-header`, `src/a.rs`\n\
                    `parse_body` parses\n```\n`Gone` in a block\n```\n`read_body::Gone` and `Shared()`\n";
        let missing = missing_names(page, &words, &functions);
        assert_eq!(
            missing,
            vec![
                (2, "parse_body".to_string()),
                (6, "read_body::Gone".to_string()),
                (6, "Shared()".to_string()),
            ]
        );
    }

    #[test]
    fn the_code_map_names_files_and_folders_in_the_crate_section() {
        let page = "### `crates/a`\n\n- `x.rs`: x.\n- `dir/`: d. `other/sub.rs`\n\n### `crates/b`\n\n- `y.rs`\n";
        let e = |f: &str, d: bool| (f.to_owned(), d);
        let entries = [
            e("lib.rs", false),
            e("x.rs", false),
            e("dir", true),
            e("other", true),
        ];
        assert!(code_map_violations(page, "a", &entries).is_empty());
        // `y.rs` is named, but in crate b's section, not a's.
        let v = code_map_violations(page, "a", &[e("y.rs", false), e("gone", true)]);
        assert_eq!(v.len(), 2, "{v:?}");
        assert!(v[0].detail.contains("src/y.rs is not named"), "{}", v[0]);
        assert!(v[1].detail.contains("src/gone/"), "{}", v[1]);
        let missing = code_map_violations(page, "c", &entries);
        assert_eq!(missing.len(), 1);
        assert!(
            missing[0].detail.contains("no `### `crates/c``"),
            "{}",
            missing[0]
        );
    }

    #[test]
    fn dated_phrases_are_whole_words_in_any_case() {
        let text = "It works.\nToday's build\nthis is (for now) so\ntodays_value and todayish\nComes later.\n";
        assert_eq!(
            find_dated_phrases(text),
            vec![(2, "today"), (3, "for now"), (5, "comes later")]
        );
        assert!(find_dated_phrases("being builtin\nthe forknow").is_empty());
    }

    #[test]
    fn violations_read_as_rule_location_detail() {
        let v = Violation {
            rule: "crate-docs",
            location: "crates/x/src/lib.rs:1".into(),
            detail: "add a doc".into(),
        };
        assert_eq!(
            v.to_string(),
            "[crate-docs] crates/x/src/lib.rs:1: add a doc"
        );
        assert!(report(&[v]).starts_with("tidy found 1 problem(s):\n  [crate-docs]"));
    }

    #[test]
    fn publish_field_is_read_like_cargo_does() {
        assert!(is_publishable(&serde_json::json!({"publish": null})));
        assert!(is_publishable(&serde_json::json!({})));
        assert!(!is_publishable(&serde_json::json!({"publish": []})));
        assert!(is_publishable(
            &serde_json::json!({"publish": ["crates-io"]})
        ));
    }
}
