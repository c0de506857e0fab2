//! Parsing of attribute options, with errors that list what is accepted.

use proc_macro2::{Span, TokenStream};
use syn::meta::ParseNestedMeta;
use syn::parse::Parser;
use syn::{Expr, ExprLit, Lit, LitStr, Path};

/// The accepted options of an attribute, for parsing and for messages.
pub(crate) struct Options {
    pub(crate) attr: &'static str,
    pub(crate) accepted: &'static [Accepted],
}

/// One accepted option: its name, the kind of its value, what the value is, and an example.
pub(crate) struct Accepted {
    pub(crate) name: &'static str,
    pub(crate) kind: Kind,
    pub(crate) value: &'static str,
    pub(crate) example: &'static str,
}

/// The kind of literal an option takes.
#[derive(Clone, Copy)]
pub(crate) enum Kind {
    /// A whole number, `every = 4`.
    Int,
    /// A path in a string, `crate = "tensorscope"`.
    Path,
    /// A string, `precision = "f16"`.
    Str,
    /// A bare word with no value, `skip` (parsed by the caller: [`parse`] takes `key = value` only).
    Flag,
}

/// A parsed option value.
pub(crate) enum Value {
    Int(u64),
    Path(Path),
    Str(String),
}

/// An option as given: its key and value, with their spans for later errors (a rule about the
/// value, such as `every = 0`, points at the value; one about the key, such as a repeat, at the key).
pub(crate) struct Found {
    pub(crate) key: String,
    pub(crate) key_span: Span,
    pub(crate) value_span: Span,
    pub(crate) value: Value,
}

/// Parses `key = value, ...` and returns the options that parsed. Every problem (unknown keys with a
/// did-you-mean, repeated keys, values of the wrong kind) is pushed to `errors`, and the rest is still
/// parsed, so that the caller can check it too and the user sees every mistake at once.
pub(crate) fn parse(
    options: &Options,
    args: TokenStream,
    errors: &mut Vec<syn::Error>,
) -> Vec<Found> {
    let mut found: Vec<Found> = Vec::new();
    let parser = syn::meta::parser(|meta: ParseNestedMeta<'_>| {
        let path = &meta.path;
        let key = path
            .get_ident()
            .map_or_else(|| quote::quote!(#path).to_string(), ToString::to_string);
        let span = syn::spanned::Spanned::span(&meta.path);
        let value: Expr = meta.value()?.parse()?;
        match options.accepted.iter().find(|a| a.name == key) {
            None => errors.push(syn::Error::new(span, unknown_key(options, &key))),
            Some(_) if found.iter().any(|f| f.key == key) => errors.push(syn::Error::new(
                span,
                format!("`{key}` is given twice; keep one"),
            )),
            Some(accepted) => match parse_value(accepted.kind, &value) {
                Some(v) => found.push(Found {
                    key,
                    key_span: span,
                    value_span: syn::spanned::Spanned::span(&value),
                    value: v,
                }),
                None => errors.push(syn::Error::new_spanned(
                    &value,
                    format!(
                        "`{key}` expects {}, as in `{}`",
                        accepted.value, accepted.example
                    ),
                )),
            },
        }
        Ok(())
    });
    if let Err(e) = parser.parse2(args) {
        errors.push(syn::Error::new(
            e.span(),
            format!("{e}; {} accepts {}", options.attr, accepted_list(options)),
        ));
    }
    found
}

/// All of `errors` as one error (shown together), or `Ok` if there are none.
pub(crate) fn combine(errors: Vec<syn::Error>) -> syn::Result<()> {
    match errors.into_iter().reduce(|mut a, b| {
        a.combine(b);
        a
    }) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

fn parse_value(kind: Kind, value: &Expr) -> Option<Value> {
    let Expr::Lit(ExprLit { lit, .. }) = value else {
        return None;
    };
    match (kind, lit) {
        (Kind::Path, Lit::Str(s)) => parse_path(s).map(Value::Path),
        (Kind::Int, Lit::Int(i)) => i.base10_parse().ok().map(Value::Int),
        (Kind::Str, Lit::Str(s)) => Some(Value::Str(s.value())),
        _ => None,
    }
}

fn parse_path(s: &LitStr) -> Option<Path> {
    s.parse_with(Path::parse_mod_style).ok()
}

fn accepted_list(options: &Options) -> String {
    options
        .accepted
        .iter()
        .map(|a| format!("`{}`", a.example))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The message for an option `options` does not accept: the accepted ones, and the closest as a
/// did-you-mean.
pub(crate) fn unknown_key(options: &Options, key: &str) -> String {
    let mut message = format!("unknown option `{key}` for {}", options.attr);
    let closest = options
        .accepted
        .iter()
        .map(|a| (strsim::levenshtein(key, a.name), a.name))
        .filter(|&(d, name)| d <= 3 || name.contains(key) || key.contains(name))
        .min();
    if let Some((_, name)) = closest {
        message += &format!("; did you mean `{name}`?");
    }
    message + &format!(" Accepted: {}", accepted_list(options))
}
