//! The `unsafe` code of the workspace's library crates (the runtime, the macros and the facade),
//! read from their sources, against the list in `docs/design.md` ("Unsafe code"): every module
//! with an `unsafe` block, impl, fn or trait, or an `allow(unsafe_code)`, is listed there with how
//! many of each it has, and nothing else is. A new `unsafe` fails this test until the doc says
//! what it does.
//!
//! The sources are read as tokens: comments, strings and character literals are skipped, so a doc
//! comment or a message that mentions `unsafe` is not code.
//!
//! ```sh
//! cargo test --test unsafe_code
//! ```

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

#[path = "../runtime/tests/common/sources.rs"]
mod sources;
use sources::files;

/// The crates whose sources are read, from the workspace root.
const SOURCES: &[&str] = &["runtime/src", "macros/src", "src"];

/// What follows an `unsafe` keyword, counted per module.
const KINDS: &[&str] = &["block", "fn", "impl", "trait"];

/// The `unsafe` of one module: how many of each of [`KINDS`], and whether it allows
/// `unsafe_code`.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Uses {
    counts: BTreeMap<String, usize>,
    allows: bool,
}

impl Uses {
    fn is_empty(&self) -> bool {
        !self.allows && self.counts.values().all(|&n| n == 0)
    }
}

/// A token of Rust source: an identifier (keywords included) or one punctuation character.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Ident(String),
    Punct(char),
}

/// The identifiers and punctuation of `text`; comments (nested block comments too), string,
/// byte-string and raw-string literals, character literals, lifetimes and numbers are dropped.
fn tokens(text: &str) -> Vec<Token> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
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
        } else if c == '\'' {
            // A character literal ('x', '\n', '\u{..}') or a lifetime ('a).
            if next == Some('\\') {
                // Past the quote, the backslash and the escaped character.
                i += 3;
                while i < chars.len() && chars[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if chars.get(i + 2) == Some(&'\'') {
                i += 3;
            } else {
                i += 1;
                while i < chars.len() && is_ident(chars[i]) {
                    i += 1;
                }
            }
        } else if is_ident(c) {
            let start = i;
            while i < chars.len() && is_ident(chars[i]) {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let prefix = matches!(word.as_str(), "r" | "br" | "cr");
            let quote = chars.get(i).copied();
            if prefix && matches!(quote, Some('"' | '#')) && raw_string_at(&chars, i) {
                i = skip_raw_string(&chars, i);
            } else if matches!(word.as_str(), "b" | "c") && quote == Some('"') {
                i = skip_string(&chars, i + 1);
            } else if matches!(word.as_str(), "b") && quote == Some('\'') {
                // A byte literal: b'x' or b'\n'.
                i += 1;
                if chars.get(i) == Some(&'\\') {
                    i += 1;
                }
                i += 1;
                while i < chars.len() && chars[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if !c.is_ascii_digit() {
                out.push(Token::Ident(word));
            }
        } else if !c.is_whitespace() {
            out.push(Token::Punct(c));
            i += 1;
        } else {
            i += 1;
        }
    }
    out
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The index past the closing quote of a string whose contents start at `i`.
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

/// Whether `#`s then a quote start at `i` (a raw string after its `r`).
fn raw_string_at(chars: &[char], mut i: usize) -> bool {
    while chars.get(i) == Some(&'#') {
        i += 1;
    }
    chars.get(i) == Some(&'"')
}

/// The index past a raw string whose `#`s (if any) start at `i`.
fn skip_raw_string(chars: &[char], mut i: usize) -> usize {
    let mut hashes = 0;
    while chars[i] == '#' {
        hashes += 1;
        i += 1;
    }
    i += 1;
    while i < chars.len() {
        if chars[i] == '"' && (1..=hashes).all(|h| chars.get(i + h) == Some(&'#')) {
            return i + 1 + hashes;
        }
        i += 1;
    }
    i
}

/// The `unsafe` of one file's source.
fn uses(text: &str) -> Uses {
    let tokens = tokens(text);
    let mut uses = Uses::default();
    for (i, token) in tokens.iter().enumerate() {
        let Token::Ident(word) = token else { continue };
        match word.as_str() {
            "unsafe" => {
                let kind = match tokens.get(i + 1) {
                    Some(Token::Punct('{')) => "block",
                    Some(Token::Ident(next)) if KINDS.contains(&next.as_str()) => next,
                    // `unsafe extern`, or a keyword this test does not know: a new kind to list.
                    other => panic!("`unsafe` followed by {other:?}: add its kind to KINDS"),
                };
                *uses.counts.entry(kind.to_string()).or_default() += 1;
            }
            "unsafe_code" => uses.allows |= allowed_at(&tokens, i),
            _ => {}
        }
    }
    uses
}

/// Whether the lint at `tokens[i]` is inside `allow(..)` or `expect(..)` (not `deny`, `forbid`
/// or `warn`): the identifier before its innermost open parenthesis.
fn allowed_at(tokens: &[Token], i: usize) -> bool {
    let mut depth = 0;
    for j in (0..i).rev() {
        match &tokens[j] {
            Token::Punct(')') => depth += 1,
            Token::Punct('(') if depth == 0 => {
                return matches!(
                    j.checked_sub(1).map(|k| &tokens[k]),
                    Some(Token::Ident(w)) if w == "allow" || w == "expect"
                );
            }
            Token::Punct('(') => depth -= 1,
            _ => {}
        }
    }
    false
}

/// Every module of [`SOURCES`] with `unsafe`, by its path from the workspace root.
fn in_code(root: &Path) -> BTreeMap<String, Uses> {
    let mut all = Vec::new();
    for dir in SOURCES {
        files(&root.join(dir), &mut all);
    }
    all.iter()
        .map(|file| {
            let text = fs::read_to_string(file).expect("a readable source file");
            let rel = file.strip_prefix(root).expect("a file under the root");
            (rel.to_string_lossy().replace('\\', "/"), uses(&text))
        })
        .filter(|(_, uses)| !uses.is_empty())
        .collect()
}

/// The list of the "Unsafe code" section of `docs/design.md`: lines `` - `path`: counts; what it
/// does``, the counts as `N block(s)`, `N fn(s)`, `N impl(s)`, `N trait(s)` and `allows
/// unsafe_code`, separated by commas.
fn in_doc(design: &str) -> BTreeMap<String, Uses> {
    let section = design
        .split("\n## ")
        .find(|s| s.starts_with("Unsafe code\n"))
        .expect("docs/design.md has a section \"## Unsafe code\"");
    let mut listed = BTreeMap::new();
    for line in section.lines() {
        let Some(item) = line.strip_prefix("- `") else {
            continue;
        };
        let (path, rest) = item
            .split_once("`: ")
            .expect("- `path`: counts; what it does");
        let (counts, _) = rest.split_once(';').expect("counts, then `;`");
        let mut uses = Uses::default();
        for part in counts.split(',').map(str::trim) {
            if part == "allows `unsafe_code`" {
                uses.allows = true;
                continue;
            }
            let (n, kind) = part.split_once(' ').expect("`N kind`");
            let n: usize = n.parse().expect("a count");
            let kind = kind.trim_end_matches('s').trim_matches('`');
            assert!(KINDS.contains(&kind), "{path}: unknown kind {kind:?}");
            uses.counts.insert(kind.to_string(), n);
        }
        assert!(
            listed.insert(path.to_string(), uses).is_none(),
            "{path} is listed twice"
        );
    }
    listed
}

/// The differences between the modules the code has and those the doc lists, one a line.
fn differences(code: &BTreeMap<String, Uses>, doc: &BTreeMap<String, Uses>) -> Vec<String> {
    let mut out = Vec::new();
    for (path, uses) in code {
        match doc.get(path) {
            None => out.push(format!(
                "{path} has unsafe code the doc does not list: {uses:?}"
            )),
            Some(listed) if listed != uses => out.push(format!(
                "{path}: the code has {uses:?}, the doc lists {listed:?}"
            )),
            Some(_) => {}
        }
    }
    for path in doc.keys().filter(|p| !code.contains_key(*p)) {
        out.push(format!("{path} is listed but has no unsafe code"));
    }
    out
}

#[test]
fn the_unsafe_code_is_the_list_in_the_design_doc() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let design = fs::read_to_string(root.join("docs/design.md")).expect("docs/design.md");
    let (code, doc) = (in_code(root), in_doc(&design));
    for (path, uses) in &code {
        println!("{path}: {uses:?}");
    }
    let diff = differences(&code, &doc);
    assert!(
        diff.is_empty(),
        "docs/design.md (\"Unsafe code\") and the code differ:\n{}",
        diff.join("\n")
    );
}

#[test]
fn comments_strings_and_lint_levels_are_not_unsafe_code() {
    let text = r###"
        //! The one `unsafe` here ...
        /* unsafe { /* nested: unsafe */ still a comment: unsafe } */
        #![deny(unsafe_code)]
        #[warn(dead_code, unsafe_code)]
        const A: &str = "unsafe { \" unsafe";
        const B: &str = r##"unsafe "# unsafe"##;
        const C: &[u8] = b"unsafe";
        const D: char = '"';
        const Q: char = '\'';
        const E: u8 = b'"';
        fn f<'a>(x: &'a str) -> char { 'u' }
    "###;
    assert_eq!(uses(text), Uses::default());
    let text = r#"
        #![allow(clippy::all, unsafe_code)]
        unsafe impl Send for W {}
        unsafe fn g() {}
        fn h() { let s = "}"; unsafe { g() } }
    "#;
    let counts = [("fn", 1), ("impl", 1), ("block", 1)];
    let want = Uses {
        counts: counts.map(|(k, n)| (k.to_string(), n)).into(),
        allows: true,
    };
    assert_eq!(uses(text), want);
}

#[test]
fn a_module_missing_from_the_doc_or_miscounted_is_reported() {
    let doc = in_doc(
        "# D\n\n## Unsafe code\n\n- `a.rs`: 2 blocks, 1 impl, allows `unsafe_code`; what.\n\
         - `gone.rs`: 1 block; gone.\n\n## Next\n\n- `b.rs`: 1 block; not this section.\n",
    );
    let mut code = BTreeMap::new();
    let a = Uses {
        counts: [("block".to_string(), 2), ("impl".to_string(), 1)].into(),
        allows: true,
    };
    code.insert("a.rs".to_string(), a.clone());
    code.insert("new.rs".to_string(), a.clone());
    let diff = differences(&code, &doc);
    assert_eq!(diff.len(), 2, "{diff:?}");
    assert!(diff[0].starts_with("new.rs has unsafe code the doc does not list"));
    assert_eq!(diff[1], "gone.rs is listed but has no unsafe code");
    code.get_mut("a.rs")
        .expect("a.rs")
        .counts
        .insert("block".into(), 3);
    assert!(differences(&code, &doc)[0].starts_with("a.rs: the code has"));
}
