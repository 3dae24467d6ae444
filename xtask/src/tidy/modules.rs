//! The module graph of a crate, for `module-cycles`.
//!
//! Every path a module's code writes (`crate::a::B`, `super::b::C`, `self::c`, `d::E`
//! when `d` is a child module, a `use` tree with its groups across lines) is resolved to
//! the module that holds its target, following the `use` re-exports on the way
//! (`crate::record::X` where the root says `pub use trace::record` is `trace::record`;
//! `crate::Error` where it says `pub use error::Error` is `error`). A path from module
//! `p::a::…` to module `p::b::…` is an edge `a → b` among the children of `p`, so the
//! modules of one folder are checked against each other at every depth, not only at the
//! top. Comments, string and character literals, `$crate` and the items under
//! `#[cfg(test)]` (and the files `tests.rs`, `tests/`) are not read: tests may use what
//! they test from anywhere.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::Path;

/// One token of Rust source, as far as paths need: a word, `::`, or another character.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Tok {
    Ident(String),
    PathSep,
    Punct(char),
}

/// The tokens of `text`, without comments, literals and lifetimes.
fn tokenize(text: &str) -> Vec<Tok> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    let n = chars.len();
    let ident_char = |c: char| c.is_alphanumeric() || c == '_';
    while i < n {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        let prefixed = if matches!(c, 'r' | 'b' | 'c') && !out_ends_in_ident(&chars, i) {
            string_start(&chars, i)
        } else {
            None
        };
        if c.is_whitespace() {
            i += 1;
        } else if c == '/' && next == Some('/') {
            while i < n && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0usize;
            while i < n {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if c == '"' {
            i = skip_string(&chars, i + 1);
        } else if let Some(Quoted::Prefixed(quote)) = prefixed {
            i = skip_string(&chars, quote + 1);
        } else if let Some(Quoted::Raw { hashes, quote }) = prefixed {
            // r#"…"#: ends at a quote followed by as many hashes.
            let mut j = quote + 1;
            while j < n
                && !(chars[j] == '"' && (1..=hashes).all(|k| chars.get(j + k) == Some(&'#')))
            {
                j += 1;
            }
            i = j + 1 + hashes;
        } else if c == 'b' && next == Some('\'') && !out_ends_in_ident(&chars, i) {
            // A byte literal (b'x'): the character literal after its prefix.
            i += 1;
        } else if c == '\'' {
            // A character literal ('a', '\n', '\u{1F600}') or a lifetime ('a).
            if next == Some('\\') {
                let mut j = i + 3;
                while j < n && chars[j] != '\'' {
                    j += 1;
                }
                i = j + 1;
            } else if chars.get(i + 2) == Some(&'\'') {
                i += 3;
            } else {
                i += 1;
                while i < n && ident_char(chars[i]) {
                    i += 1;
                }
            }
        } else if c.is_ascii_digit() {
            while i < n && (ident_char(chars[i]) || chars[i] == '.' && next_is_digit(&chars, i)) {
                i += 1;
            }
        } else if ident_char(c) {
            // A raw identifier (`r#type`) is the word after `r#`.
            if c == 'r' && next == Some('#') && chars.get(i + 2).is_some_and(|c| ident_char(*c)) {
                i += 2;
            }
            let start = i;
            while i < n && ident_char(chars[i]) {
                i += 1;
            }
            out.push(Tok::Ident(chars[start..i].iter().collect()));
        } else if c == ':' && next == Some(':') {
            out.push(Tok::PathSep);
            i += 2;
        } else {
            out.push(Tok::Punct(c));
            i += 1;
        }
    }
    out
}

fn next_is_digit(chars: &[char], i: usize) -> bool {
    chars.get(i + 1).is_some_and(char::is_ascii_digit)
}

fn out_ends_in_ident(chars: &[char], i: usize) -> bool {
    i > 0 && (chars[i - 1].is_alphanumeric() || chars[i - 1] == '_')
}

/// Where a string literal with a prefix starts.
#[derive(Debug, Clone, Copy)]
enum Quoted {
    /// `b"…"`, `c"…"`: an ordinary string after its prefix; the index of its quote.
    Prefixed(usize),
    /// `r"…"`, `r#"…"#`, `br#"…"#`: how many hashes close it; the index of its quote.
    Raw { hashes: usize, quote: usize },
}

/// At a `r`, `b` or `c` that starts a word: the string literal it begins, if any.
fn string_start(chars: &[char], i: usize) -> Option<Quoted> {
    let mut j = i;
    if chars[j] == 'b' || chars[j] == 'c' {
        j += 1;
        if chars.get(j) == Some(&'"') {
            return Some(Quoted::Prefixed(j));
        }
    }
    if chars.get(j) != Some(&'r') {
        return None;
    }
    j += 1;
    let mut hashes = 0;
    while chars.get(j) == Some(&'#') {
        hashes += 1;
        j += 1;
    }
    (chars.get(j) == Some(&'"')).then_some(Quoted::Raw { hashes, quote: j })
}

/// The index after the closing quote of a string whose text starts at `i`.
fn skip_string(chars: &[char], mut i: usize) -> usize {
    while i < chars.len() {
        match chars[i] {
            '\\' => i += 2,
            '"' => return i + 1,
            _ => i += 1,
        }
    }
    i
}

/// The tokens without the items marked `#[cfg(test)]` (attributes, then an item up to
/// its `;`, its closing brace or the end of what holds it).
fn drop_test_items(toks: Vec<Tok>) -> Vec<Tok> {
    let cfg_test = [
        Tok::Punct('#'),
        Tok::Punct('['),
        Tok::Ident("cfg".into()),
        Tok::Punct('('),
        Tok::Ident("test".into()),
        Tok::Punct(')'),
        Tok::Punct(']'),
    ];
    let mut out = Vec::with_capacity(toks.len());
    let mut i = 0;
    while i < toks.len() {
        if toks[i..].starts_with(&cfg_test) {
            i += cfg_test.len();
            let mut depth = 0usize;
            while i < toks.len() {
                match &toks[i] {
                    Tok::Punct('{' | '(' | '[') => depth += 1,
                    // The end of what holds the item (a field's struct): not its own.
                    Tok::Punct('}' | ')' | ']') if depth == 0 => break,
                    Tok::Punct('}' | ')' | ']') => {
                        depth -= 1;
                        if depth == 0 && toks[i] == Tok::Punct('}') {
                            i += 1;
                            break;
                        }
                    }
                    Tok::Punct(';') if depth == 0 => {
                        i += 1;
                        break;
                    }
                    _ => {}
                }
                i += 1;
            }
            continue;
        }
        out.push(toks[i].clone());
        i += 1;
    }
    out
}

/// Where a path starts.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Start {
    /// `crate::`
    Root,
    /// `super::` this many times.
    Up(usize),
    /// `self::`
    Here,
    /// A plain first word: a child module, a name a `use` brought in, or another crate.
    Plain,
}

/// A path as written in a module: its start and its words (`*` for a glob).
#[derive(Debug, Clone, PartialEq, Eq)]
struct WrittenPath {
    start: Start,
    segments: Vec<String>,
}

/// A module's code as the graph needs it.
#[derive(Debug, Default)]
struct Module {
    /// The paths its code writes.
    paths: Vec<WrittenPath>,
    /// The names its `use` items bind at its top level, to the path each names.
    bindings: BTreeMap<String, WrittenPath>,
}

/// Reads one file's modules (the file's own and the inline `mod x { … }` in it) into
/// `modules`, keyed by their path from the crate root.
fn read_file(module: &[String], text: &str, modules: &mut BTreeMap<Vec<String>, Module>) {
    let toks = drop_test_items(tokenize(text));
    // The stack of open braces: `Some(module path)` where an inline module opens.
    let mut stack: Vec<Option<Vec<String>>> = Vec::new();
    let mut current: Vec<String> = module.to_vec();
    modules.entry(current.clone()).or_default();
    let ident = |t: Option<&Tok>| match t {
        Some(Tok::Ident(w)) => Some(w.clone()),
        _ => None,
    };
    let mut i = 0;
    while i < toks.len() {
        match &toks[i] {
            Tok::Ident(w) if w == "mod" => {
                if let (Some(name), Some(Tok::Punct('{'))) =
                    (ident(toks.get(i + 1)), toks.get(i + 2))
                {
                    current.push(name);
                    modules.entry(current.clone()).or_default();
                    stack.push(Some(current.clone()));
                    i += 3;
                    continue;
                }
            }
            Tok::Punct('{') => stack.push(None),
            Tok::Punct('}') => {
                if let Some(Some(_)) = stack.pop() {
                    current.pop();
                }
            }
            Tok::Ident(w) if w == "use" => {
                // A `use` at the module's own level binds names its children see too.
                let at_top = stack.last().is_none_or(Option::is_some);
                let (paths, next) = parse_tree(&toks, i + 1, None);
                let entry = modules.entry(current.clone()).or_default();
                for (path, binding) in paths {
                    if at_top {
                        if let Some(name) = binding {
                            entry.bindings.insert(name, path.clone());
                        }
                    }
                    entry.paths.push(path);
                }
                i = next;
                continue;
            }
            Tok::Ident(_) if starts_path(&toks, i) => {
                let (paths, next) = parse_tree(&toks, i, None);
                let entry = modules.entry(current.clone()).or_default();
                entry.paths.extend(paths.into_iter().map(|(p, _)| p));
                i = next.max(i + 1);
                continue;
            }
            _ => {}
        }
        i += 1;
    }
}

/// Whether the word at `i` starts a path: it is followed by `::` and follows no `::`,
/// `$` (`$crate`) or `.` (a method's turbofish).
fn starts_path(toks: &[Tok], i: usize) -> bool {
    let before = i.checked_sub(1).map(|b| &toks[b]);
    toks.get(i + 1) == Some(&Tok::PathSep)
        && !matches!(
            before,
            Some(Tok::PathSep | Tok::Punct('$') | Tok::Punct('.'))
        )
}

/// Parses a use tree (or an expression's path) from `i`: each leaf path with the name
/// it binds (`None` for `self` in a group's root, globs and paths outside `use`).
/// `prefix` is the path the enclosing group already wrote.
fn parse_tree(
    toks: &[Tok],
    mut i: usize,
    prefix: Option<&WrittenPath>,
) -> (Vec<(WrittenPath, Option<String>)>, usize) {
    let mut path = prefix.cloned().unwrap_or(WrittenPath {
        start: Start::Plain,
        segments: Vec::new(),
    });
    let mut out = Vec::new();
    // A leading `::` (`use ::std::x`) names another crate.
    if prefix.is_none() && toks.get(i) == Some(&Tok::PathSep) {
        return (out, i + 1);
    }
    loop {
        match toks.get(i) {
            Some(Tok::Ident(w)) => {
                let fresh = path.segments.is_empty() && path.start == Start::Plain;
                match w.as_str() {
                    "crate" if fresh => path.start = Start::Root,
                    "super" if path.segments.is_empty() => {
                        path.start = match path.start {
                            Start::Up(k) => Start::Up(k + 1),
                            _ => Start::Up(1),
                        }
                    }
                    "self" if path.segments.is_empty() && fresh => path.start = Start::Here,
                    "self" => {
                        // `a::{self}` binds `a`.
                        let name = path.segments.last().cloned();
                        i += 1;
                        let (binding, next) = alias(toks, i, name);
                        out.push((path, binding));
                        return (out, next);
                    }
                    _ => path.segments.push(w.clone()),
                }
                i += 1;
                if toks.get(i) == Some(&Tok::PathSep) {
                    i += 1;
                    continue;
                }
                let name = path.segments.last().cloned();
                let (binding, next) = alias(toks, i, name);
                out.push((path, binding));
                return (out, next);
            }
            Some(Tok::Punct('*')) => {
                path.segments.push("*".into());
                out.push((path, None));
                return (out, i + 1);
            }
            Some(Tok::Punct('{')) => {
                i += 1;
                loop {
                    match toks.get(i) {
                        None => return (out, i),
                        Some(Tok::Punct('}')) => return (out, i + 1),
                        Some(Tok::Punct(',')) => i += 1,
                        Some(_) => {
                            let (inner, next) = parse_tree(toks, i, Some(&path));
                            out.extend(inner);
                            // Step past whatever the inner tree could not read.
                            i = if next > i { next } else { i + 1 };
                        }
                    }
                }
            }
            _ => {
                if !path.segments.is_empty() || path.start != Start::Plain {
                    out.push((path, None));
                }
                return (out, i);
            }
        }
    }
}

/// Reads `as name` after a use leaf: the name it binds (`_` binds none).
fn alias(toks: &[Tok], i: usize, name: Option<String>) -> (Option<String>, usize) {
    if toks.get(i) == Some(&Tok::Ident("as".into())) {
        match toks.get(i + 1) {
            Some(Tok::Ident(w)) if w != "_" => return (Some(w.clone()), i + 2),
            _ => return (None, i + 2),
        }
    }
    (name, i)
}

/// A crate's modules, read from its files.
#[derive(Debug, Default)]
pub struct ModuleTree {
    modules: BTreeMap<Vec<String>, Module>,
}

impl ModuleTree {
    /// Reads a crate's files: `(path under src/, text)`. The crate root is `lib.rs`;
    /// `main.rs`, `bin/` and test files (`tests.rs`, `tests/`) are left out.
    pub fn read(files: &[(String, String)]) -> Self {
        let mut modules = BTreeMap::new();
        for (rel, text) in files {
            if let Some(module) = file_module(Path::new(rel)) {
                read_file(&module, text, &mut modules);
            }
        }
        Self { modules }
    }

    fn is_module(&self, path: &[String]) -> bool {
        self.modules.contains_key(path)
    }

    /// The module that holds what `path`, written in module `at`, names; `None` for
    /// another crate's item or a name of a function's own scope.
    fn resolve(&self, at: &[String], path: &WrittenPath, depth: usize) -> Option<Vec<String>> {
        if depth > 16 {
            return None;
        }
        let mut base: Vec<String> = match path.start {
            Start::Root => Vec::new(),
            Start::Here => at.to_vec(),
            Start::Up(k) => at[..at.len().checked_sub(k)?].to_vec(),
            Start::Plain => {
                let first = path.segments.first()?;
                let mut child = at.to_vec();
                child.push(first.clone());
                if !self.is_module(&child) && !self.binds(at, first) {
                    return None;
                }
                at.to_vec()
            }
        };
        for (n, segment) in path.segments.iter().enumerate() {
            let mut child = base.clone();
            child.push(segment.clone());
            if self.is_module(&child) {
                base = child;
                continue;
            }
            if let Some(target) = self
                .modules
                .get(&base)
                .and_then(|m| m.bindings.get(segment))
            {
                // A re-export: go on from where it points.
                let mut target = target.clone();
                target
                    .segments
                    .extend(path.segments[n + 1..].iter().cloned());
                return self.resolve(&base, &target, depth + 1).or(Some(base));
            }
            break;
        }
        Some(base)
    }

    fn binds(&self, at: &[String], name: &str) -> bool {
        self.modules
            .get(at)
            .is_some_and(|m| m.bindings.contains_key(name))
    }

    /// The edges among sibling modules: for each parent module (the root is `[]`), its
    /// child `a` → child `b` where code in `a` (or below it) names something in `b` (or
    /// below it).
    pub fn sibling_edges(&self) -> BTreeMap<Vec<String>, BTreeMap<String, BTreeSet<String>>> {
        let mut out: BTreeMap<Vec<String>, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
        for (at, module) in &self.modules {
            // Every module is a node of its parent's graph, edges or not.
            if let Some((last, parent)) = at.split_last() {
                out.entry(parent.to_vec())
                    .or_default()
                    .entry(last.clone())
                    .or_default();
            }
            for path in &module.paths {
                let Some(target) = self.resolve(at, path, 0) else {
                    continue;
                };
                let common = at.iter().zip(&target).take_while(|(a, b)| a == b).count();
                if common < at.len() && common < target.len() {
                    out.entry(at[..common].to_vec())
                        .or_default()
                        .entry(at[common].clone())
                        .or_default()
                        .insert(target[common].clone());
                }
            }
        }
        out
    }

    /// Every cycle among sibling modules, one per set of modules that all reach each
    /// other, its modules written as full paths (`trace::record`).
    pub fn cycles(&self) -> Vec<Cycle> {
        let mut out = Vec::new();
        for (parent, edges) in self.sibling_edges() {
            let full = |names: Vec<String>| -> Vec<String> {
                names
                    .into_iter()
                    .map(|m| {
                        let mut full = parent.clone();
                        full.push(m);
                        full.join("::")
                    })
                    .collect()
            };
            for cycle in graph_cycles(&edges) {
                out.push(Cycle {
                    path: full(cycle.path),
                    tangle: full(cycle.tangle),
                });
            }
        }
        out
    }
}

/// The module a file under `src/` holds (`a.rs` and `a/mod.rs` hold `a`, `a/b.rs`
/// holds `a::b`, `lib.rs` the root); `None` for binaries and test files.
fn file_module(rel: &Path) -> Option<Vec<String>> {
    let parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let (file, folders) = parts.split_last()?;
    if parts[0] == "bin" || parts == ["main.rs"] {
        return None;
    }
    if file == "tests.rs" || folders.iter().any(|f| f == "tests") {
        return None;
    }
    let mut module = folders.to_vec();
    match file.strip_suffix(".rs")? {
        "mod" => {}
        "lib" if folders.is_empty() => {}
        stem => module.push(stem.to_owned()),
    }
    Some(module)
}

/// A cycle among modules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cycle {
    /// The shortest cycle from the set's smallest module back to itself, closed
    /// (`a → b → a`).
    pub path: Vec<String>,
    /// Every module of the set (all reach each other), sorted: breaking `path` alone
    /// leaves a cycle while the set has more modules than `path`.
    pub tangle: Vec<String>,
}

/// The cycles of a directed graph, one through each strongly connected set of nodes.
pub fn graph_cycles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Cycle> {
    let reach = |from: &String| -> BTreeSet<String> {
        let mut found = BTreeSet::new();
        let mut stack = vec![from.clone()];
        while let Some(m) = stack.pop() {
            for next in edges.get(&m).into_iter().flatten() {
                if found.insert(next.clone()) {
                    stack.push(next.clone());
                }
            }
        }
        found
    };
    let mut cycles = Vec::new();
    let mut seen = BTreeSet::new();
    for start in edges.keys() {
        if seen.contains(start) {
            continue;
        }
        let forward = reach(start);
        if !forward.contains(start) {
            continue;
        }
        let component: BTreeSet<String> = forward
            .iter()
            .filter(|m| reach(m).contains(start))
            .cloned()
            .collect();
        // A shortest way back to `start` inside the set (breadth first).
        let mut previous: BTreeMap<String, String> = BTreeMap::new();
        let mut queue = VecDeque::from([start.clone()]);
        let mut closing = None;
        'search: while let Some(m) = queue.pop_front() {
            for next in edges.get(&m).into_iter().flatten() {
                if !component.contains(next) {
                    continue;
                }
                if next == start {
                    closing = Some(m.clone());
                    break 'search;
                }
                if !previous.contains_key(next) {
                    previous.insert(next.clone(), m.clone());
                    queue.push_back(next.clone());
                }
            }
        }
        let mut back = Vec::new();
        let mut at = closing.unwrap_or_else(|| start.clone());
        while &at != start {
            back.push(at.clone());
            at = previous.get(&at).cloned().unwrap_or_else(|| start.clone());
        }
        back.reverse();
        let mut path = vec![start.clone()];
        path.extend(back);
        path.push(start.clone());
        let tangle: Vec<String> = component.iter().cloned().collect();
        seen.extend(component);
        cycles.push(Cycle { path, tangle });
    }
    cycles
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(files: &[(&str, &str)]) -> ModuleTree {
        let files: Vec<(String, String)> = files
            .iter()
            .map(|(p, t)| ((*p).to_owned(), (*t).to_owned()))
            .collect();
        ModuleTree::read(&files)
    }

    fn edges_of(t: &ModuleTree, parent: &[&str]) -> Vec<(String, String)> {
        let parent: Vec<String> = parent.iter().map(|s| (*s).to_owned()).collect();
        t.sibling_edges()
            .get(&parent)
            .into_iter()
            .flatten()
            .flat_map(|(a, bs)| bs.iter().map(move |b| (a.clone(), b.clone())))
            .collect()
    }

    fn pair(a: &str, b: &str) -> (String, String) {
        (a.to_owned(), b.to_owned())
    }

    #[test]
    fn paths_are_read_from_uses_groups_and_expressions() {
        let t = tree(&[
            ("lib.rs", "mod a; mod b; mod c; mod d; mod e; mod f;"),
            (
                "a.rs",
                "use crate::{\n    b,\n    c::{D, self},\n};\n// crate::e in a comment\n\
                 fn x() { let s = \"crate::e\"; crate::f::g(); $crate::e::h; }\n\
                 #[cfg(test)]\nmod tests { use crate::e; }\n",
            ),
            (
                "b.rs",
                "/* crate::a */ fn y() { 'a: loop { break 'a; } let c = 'x'; }",
            ),
            (
                "c.rs",
                "#[cfg(test)]\nuse crate::a;\nfn z() -> r#\"crate::a\"# {}",
            ),
            (
                "d.rs",
                "struct S {\n    #[cfg(test)]\n    t: u8\n}\nmod m { use crate::e::Z; }",
            ),
            ("e.rs", ""),
            ("f.rs", ""),
        ]);
        assert_eq!(
            edges_of(&t, &[]),
            vec![
                pair("a", "b"),
                pair("a", "c"),
                pair("a", "f"),
                pair("d", "e")
            ]
        );
        assert!(t.cycles().is_empty());
    }

    #[test]
    fn literals_lifetimes_and_raw_names_do_not_hide_or_invent_paths() {
        let words = |text: &str| -> Vec<String> {
            tokenize(text)
                .into_iter()
                .filter_map(|t| match t {
                    Tok::Ident(w) => Some(w),
                    _ => None,
                })
                .collect()
        };
        assert_eq!(
            words("let q = '\\''; let s = \"a\\\"crate\"; x::<'a>(b'c', br#\"d\"#, 1.5e3)"),
            ["let", "q", "let", "s", "x"]
        );
        assert_eq!(
            words("r#type /* a /* nested */ crate */ r\"e\" c\"f\" z"),
            ["type", "z"]
        );
        let t = tree(&[
            ("lib.rs", "mod a; mod b; mod c;"),
            (
                "a.rs",
                "const Q: char = '\\''; use crate::b::X; fn f<'l>(x: &'l str) {}",
            ),
            (
                "b.rs",
                "fn g() { let v = x.iter::<crate::c::T>(); crate::c::h() }",
            ),
            ("c.rs", "pub(crate) fn h() {} pub(in crate::a) struct T;"),
        ]);
        assert_eq!(
            edges_of(&t, &[]),
            vec![pair("a", "b"), pair("b", "c"), pair("c", "a")]
        );
    }

    #[test]
    fn re_exports_super_and_child_paths_resolve_to_their_module() {
        let t = tree(&[
            (
                "lib.rs",
                "mod error; mod body; mod trace;\npub use error::Error;\npub use trace::{record, log as journal};",
            ),
            ("error.rs", "use crate::record::CallRecord;"),
            ("body.rs", "fn f() -> crate::Error { todo() }"),
            ("trace/mod.rs", "pub mod record; pub mod log;\npub use record::Kept;"),
            ("trace/record.rs", "use super::super::body::JsonBody;\nuse super::log::Line;"),
            ("trace/log.rs", "use crate::journal::X; use super::Kept;"),
        ]);
        assert_eq!(
            edges_of(&t, &[]),
            vec![
                pair("body", "error"),
                pair("error", "trace"),
                pair("trace", "body")
            ]
        );
        assert_eq!(
            edges_of(&t, &["trace"]),
            vec![pair("log", "record"), pair("record", "log")]
        );
        let paths: Vec<Vec<String>> = t.cycles().into_iter().map(|c| c.path).collect();
        assert_eq!(
            paths,
            [
                vec!["body", "error", "trace", "body"],
                vec!["trace::log", "trace::record", "trace::log"],
            ]
        );
    }

    #[test]
    fn inline_modules_shift_super_and_are_nodes() {
        let t = tree(&[
            ("lib.rs", "mod a; mod b;"),
            (
                "a.rs",
                "mod inner { use super::super::b::X; }\nuse self::inner::Y;",
            ),
            ("b.rs", "use crate::a::inner::Y;"),
        ]);
        assert_eq!(edges_of(&t, &[]), vec![pair("a", "b"), pair("b", "a")]);
        let cycles = t.cycles();
        assert_eq!(cycles.len(), 1);
        assert_eq!(cycles[0].path, ["a", "b", "a"]);
        assert_eq!(cycles[0].tangle, ["a", "b"]);
    }

    #[test]
    fn cycles_are_found_once_each_from_their_smallest_module() {
        let set = |xs: &[&str]| xs.iter().map(|s| (*s).to_owned()).collect::<BTreeSet<_>>();
        let mut edges = BTreeMap::new();
        edges.insert("serve".to_owned(), set(&["respond"]));
        edges.insert("respond".to_owned(), set(&["detach", "side"]));
        edges.insert("detach".to_owned(), set(&["serve"]));
        edges.insert("side".to_owned(), set(&["respond"]));
        edges.insert("other".to_owned(), set(&["serve"]));
        edges.insert("leaf".to_owned(), set(&[]));
        let cycles = graph_cycles(&edges);
        assert_eq!(cycles.len(), 1, "{cycles:?}");
        assert_eq!(cycles[0].path, ["detach", "serve", "respond", "detach"]);
        assert_eq!(cycles[0].tangle, ["detach", "respond", "serve", "side"]);
        // Breaking the shortest cycle leaves the other one.
        edges.insert("detach".to_owned(), set(&[]));
        let cycles = graph_cycles(&edges);
        assert_eq!(cycles.len(), 1, "{cycles:?}");
        assert_eq!(cycles[0].path, ["respond", "side", "respond"]);
        edges.insert("side".to_owned(), set(&[]));
        assert!(graph_cycles(&edges).is_empty());
    }

    #[test]
    fn files_hold_their_modules() {
        let m = |p: &str| file_module(Path::new(p));
        let v = |xs: &[&str]| Some(xs.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>());
        assert_eq!(m("lib.rs"), v(&[]));
        assert_eq!(m("a.rs"), v(&["a"]));
        assert_eq!(m("a/mod.rs"), v(&["a"]));
        assert_eq!(m("a/b.rs"), v(&["a", "b"]));
        assert_eq!(m("a/lib.rs"), v(&["a", "lib"]));
        assert_eq!(m("main.rs"), None);
        assert_eq!(m("bin/x.rs"), None);
        assert_eq!(m("a/tests.rs"), None);
        assert_eq!(m("a/tests/x.rs"), None);
    }
}
