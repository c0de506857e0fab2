//! The runtime's module graph, read from its sources: which file names which, the cycles, and the
//! layers (`docs/design.md`, "Layers"). A lower layer naming a higher one fails the test, and so
//! do files outside the knot that reach each other; the graph printed by
//!
//! ```sh
//! cargo test -p tensorscope-runtime --test layers -- --nocapture
//! ```
//!
//! is the one `docs/design.md` records.
//!
//! A file names a module when its code (comments aside) holds a path to it: `crate::a::b`, a
//! `use crate::{a, b::c}` tree, or `super::x`. Paths resolve to the longest module that exists.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::Path;

#[path = "common/sources.rs"]
mod sources;
use sources::files;

/// The layers, bottom up: a module may name its own layer's and those below, never above. The
/// knot (layer 1) holds what is essential to each other: a tensor carries its scope and its graph
/// node, a scope escapes tensors, the graph keeps tensors and runs records of ops.
const LAYERS: &[(&str, &[&str])] = &[
    (
        "pool and element types",
        &[
            "dims", "element", "error", "init", "pool", "recycle", "threads", "display", "trace",
        ],
    ),
    (
        "tensors, scopes, parameters and the op core",
        &["tensor", "scope", "storage", "escape", "param", "autograd"],
    ),
    ("ops", &["ops"]),
    (
        "checkpointing, nn and the gradient check",
        &["checkpoint", "nn", "autograd::check"],
    ),
    ("the facade's adapters", &["lib", "__private"]),
];

/// A module's path (`ops::gemm::window`), from its file under `src`.
fn module_of(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).expect("a file under src");
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string())
        .collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    match parts.as_slice() {
        [only] if only == "lib" => "lib".into(),
        [only] if only == "private" => "__private".into(),
        _ => parts.join("::"),
    }
}

/// The source without comments (line comments, doc comments and block comments), so that a
/// doc's mention of a module is not an edge.
fn code(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix("//") {
            rest = after.find('\n').map_or("", |i| &after[i..]);
        } else if let Some(after) = rest.strip_prefix("/*") {
            rest = after.find("*/").map_or("", |i| &after[i + 2..]);
        } else {
            let ch = rest.chars().next().expect("not empty");
            out.push(ch);
            rest = &rest[ch.len_utf8()..];
        }
    }
    out
}

/// Every module path a file's code names, as written after `crate::` (with `use` trees
/// expanded) or after `super::` (resolved against `module`).
fn named_paths(code: &str, module: &str) -> Vec<String> {
    let mut paths = Vec::new();
    let parent: Vec<&str> = module.split("::").collect();
    for (prefix, base) in [
        ("crate::", Vec::new()),
        ("super::", parent[..parent.len().saturating_sub(1)].to_vec()),
    ] {
        let mut at = 0;
        while let Some(i) = code[at..].find(prefix) {
            let start = at + i;
            at = start + prefix.len();
            // Skip `$crate::` and identifiers ending in `crate`.
            let before = code[..start].chars().next_back();
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$') {
                continue;
            }
            let base = base.iter().map(|s| s.to_string()).collect::<Vec<_>>();
            expand(&code[at..], base, &mut paths);
        }
    }
    paths
}

/// Expands the path (or `{..}` tree) at the start of `rest` onto `base`.
fn expand(rest: &str, base: Vec<String>, out: &mut Vec<String>) {
    let mut path = base;
    let mut s = rest;
    loop {
        let ident: String = s
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if ident.is_empty() {
            if let Some(tree) = s.strip_prefix('{') {
                // Split the tree's items at top-level commas.
                let mut depth = 0;
                let mut item_start = 0;
                for (i, c) in tree.char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' if depth == 0 => {
                            expand(tree[item_start..i].trim(), path.clone(), out);
                            return;
                        }
                        '}' => depth -= 1,
                        ',' if depth == 0 => {
                            expand(tree[item_start..i].trim(), path.clone(), out);
                            item_start = i + 1;
                        }
                        _ => {}
                    }
                }
            }
            break;
        }
        s = &s[ident.len()..];
        path.push(ident);
        match s.strip_prefix("::") {
            Some(after) => s = after,
            None => break,
        }
    }
    out.push(path.join("::"));
}

/// The longest module of `modules` that `path` lies in.
fn resolve<'m>(path: &str, modules: &'m BTreeSet<String>) -> Option<&'m String> {
    let parts: Vec<&str> = path.split("::").collect();
    (1..=parts.len())
        .rev()
        .find_map(|n| modules.get(&parts[..n].join("::")))
}

/// The layer of `module`: the most specific entry of [`LAYERS`] it lies in.
fn layer(module: &str) -> usize {
    let mut best: Option<(usize, usize)> = None;
    for (i, (_, members)) in LAYERS.iter().enumerate() {
        for m in members.iter() {
            let inside = module == *m || module.starts_with(&format!("{m}::"));
            if inside && best.is_none_or(|(len, _)| m.len() > len) {
                best = Some((m.len(), i));
            }
        }
    }
    best.map(|(_, i)| i)
        .unwrap_or_else(|| panic!("module {module} is in no layer"))
}

/// The strongly connected components of more than one file (Tarjan's algorithm).
fn cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct Walk<'g> {
        graph: &'g BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'g str, usize>,
        low: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        on: BTreeSet<&'g str>,
        out: Vec<Vec<String>>,
    }
    impl<'g> Walk<'g> {
        fn visit(&mut self, v: &'g str) {
            let i = self.index.len();
            self.index.insert(v, i);
            self.low.insert(v, i);
            self.stack.push(v);
            self.on.insert(v);
            for w in &self.graph[v] {
                if !self.index.contains_key(w.as_str()) {
                    self.visit(w);
                    let lw = self.low[w.as_str()];
                    let lv = self.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(lw);
                } else if self.on.contains(w.as_str()) {
                    let iw = self.index[w.as_str()];
                    let lv = self.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(iw);
                }
            }
            if self.low[v] == self.index[v] {
                let mut component = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on.remove(w);
                    component.push(w.to_string());
                    if w == v {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    self.out.push(component);
                }
            }
        }
    }
    let mut walk = Walk {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !walk.index.contains_key(v.as_str()) {
            walk.visit(v);
        }
    }
    walk.out
}

#[test]
fn no_module_names_a_module_of_a_higher_layer() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut all = Vec::new();
    files(&src, &mut all);
    let modules: BTreeSet<String> = all.iter().map(|f| module_of(&src, f)).collect();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in &all {
        let module = module_of(&src, file);
        let text = fs::read_to_string(file).expect("a readable source file");
        let named = named_paths(&code(&text), &module);
        let edges = graph.entry(module.clone()).or_default();
        for path in named {
            if let Some(target) = resolve(&path, &modules) {
                let own = module == *target || module.starts_with(&format!("{target}::"));
                if !own {
                    edges.insert(target.clone());
                }
            }
        }
    }

    println!("Module graph of tensorscope-runtime (a file -> the modules it names):");
    for (module, edges) in &graph {
        let edges: Vec<&str> = edges.iter().map(String::as_str).collect();
        println!(
            "  {module} [{}] -> {}",
            LAYERS[layer(module)].0,
            edges.join(", ")
        );
    }
    let cycles = cycles(&graph);
    println!("Cycles (files that reach each other):");
    for c in &cycles {
        println!("  {} files: {}", c.len(), c.join(", "));
    }

    let upward: Vec<String> = graph
        .iter()
        .flat_map(|(from, edges)| edges.iter().map(move |to| (from, to)))
        .filter(|(from, to)| layer(to) > layer(from))
        .map(|(from, to)| {
            format!(
                "{from} ({}) names {to} ({})",
                LAYERS[layer(from)].0,
                LAYERS[layer(to)].0
            )
        })
        .collect();
    assert!(
        upward.is_empty(),
        "lower layers name higher ones:\n{}",
        upward.join("\n")
    );
    let knot = LAYERS
        .iter()
        .position(|(name, _)| name.starts_with("tensors"))
        .expect("the knot's layer");
    let loose: Vec<String> = cycles
        .iter()
        .filter(|c| c.iter().any(|m| layer(m) != knot))
        .map(|c| c.join(", "))
        .collect();
    assert!(
        loose.is_empty(),
        "files outside the knot reach each other:\n{}",
        loose.join("\n")
    );
}
