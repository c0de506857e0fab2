//! `#[checkpoint(...)]`: activation checkpointing inserted into a layer loop or a sequence of
//! `let` statements.

use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;
use syn::visit::Visit;
use syn::{Block, Expr, FnArg, Ident, ItemFn, Local, Pat, Path, Stmt, Type};

use crate::args::{self, Accepted, Kind, Options, Value};
use crate::item;

const OPTIONS: Options = Options {
    attr: "#[checkpoint]",
    accepted: &[
        Accepted {
            name: "every",
            kind: Kind::Int,
            value: "a whole number of layers per segment, at least 1",
            example: "every = 4",
        },
        Accepted {
            name: "policy",
            kind: Kind::Str,
            value: "\"sqrt\" (segments of about sqrt(n) layers)",
            example: "policy = \"sqrt\"",
        },
        Accepted {
            name: "memory",
            kind: Kind::Str,
            value: "a byte budget for the whole training step, such as \"64 MiB\"",
            example: "memory = \"64 MiB\"",
        },
        Accepted {
            name: "precision",
            kind: Kind::Str,
            value: "\"f32\", \"f16\" or \"bf16\"",
            example: "precision = \"f16\"",
        },
        Accepted {
            name: "saving",
            kind: Kind::Str,
            value: "\"products\" (keep matrix products' and convolutions' outputs for the replay) \
                    or \"nothing\"",
            example: "saving = \"products\"",
        },
        Accepted {
            name: "max",
            kind: Kind::Int,
            value: "the most checkpoints to store, at least 1",
            example: "max = 16",
        },
        Accepted {
            name: "replay",
            kind: Kind::Str,
            value: "the name of a function to generate that replays one layer",
            example: "replay = \"forward_layer\"",
        },
        Accepted {
            name: "crate",
            kind: Kind::Path,
            value: "the path of the tensorscope crate as a string",
            example: "crate = \"my_reexports::tensorscope\"",
        },
    ],
};

struct Settings {
    policy: TokenStream,
    precision: TokenStream,
    saving: TokenStream,
    max: Option<u64>,
    replay: Option<Ident>,
    krate: Path,
}

pub(crate) fn expand(args: TokenStream, item: TokenStream) -> TokenStream {
    item::expand_fn("#[checkpoint]", item, |func| {
        let settings = settings(args, &func)?;
        generate(&settings, func)
    })
}

fn settings(args: TokenStream, func: &ItemFn) -> syn::Result<Settings> {
    let mut errors: Vec<syn::Error> = Vec::new();
    if let Some(token) = func.sig.asyncness {
        errors.push(syn::Error::new(
            token.span(),
            "#[checkpoint] does not support `async fn`: checkpointed segments run in scopes that \
             cannot be held across an `.await`",
        ));
    }
    let found = args::parse(&OPTIONS, args, &mut errors);
    let mut settings = Settings {
        policy: TokenStream::new(),
        precision: quote!(Full),
        saving: quote!(Nothing),
        max: None,
        replay: None,
        krate: syn::parse_quote!(::tensorscope),
    };
    let mut policy_key: Option<&str> = None;
    for args::Found {
        key,
        key_span,
        value_span,
        value,
    } in &found
    {
        // Rules about the value point at the value; the one about the key, at the key.
        let error = |message: String| syn::Error::new(*value_span, message);
        match (key.as_str(), value) {
            ("every" | "policy" | "memory", _) if policy_key.is_some() => {
                errors.push(syn::Error::new(
                    *key_span,
                    format!(
                        "give one of `every`, `policy` and `memory` (`{}` is already given)",
                        policy_key.unwrap_or_default()
                    ),
                ))
            }
            ("memory", Value::Str(budget)) => match bytes(budget) {
                Ok(bytes) => {
                    policy_key = Some("memory");
                    settings.policy = quote!(Memory(#bytes));
                }
                Err(message) => errors.push(error(message)),
            },
            ("every", Value::Int(0)) => errors.push(error(
                "`every = 0` would never store a checkpoint; give at least 1".into(),
            )),
            ("every", Value::Int(k)) => {
                policy_key = Some("every");
                let k = usize::try_from(*k).unwrap_or(usize::MAX);
                settings.policy = quote!(Every(#k));
            }
            ("policy", Value::Str(p)) if p == "sqrt" => {
                policy_key = Some("policy");
                settings.policy = quote!(Sqrt);
            }
            ("policy", Value::Str(p)) => errors.push(error(format!(
                "unknown policy \"{p}\"; accepted: \"sqrt\" (or `every = N`)"
            ))),
            ("precision", Value::Str(p)) => match p.as_str() {
                "f32" => settings.precision = quote!(Full),
                "f16" => settings.precision = quote!(F16),
                "bf16" => settings.precision = quote!(Bf16),
                _ => errors.push(error(format!(
                    "unknown precision \"{p}\"; accepted: \"f32\", \"f16\", \"bf16\""
                ))),
            },
            ("saving", Value::Str(p)) => match p.as_str() {
                "products" => settings.saving = quote!(Products),
                "nothing" => settings.saving = quote!(Nothing),
                _ => errors.push(error(format!(
                    "unknown saving \"{p}\"; accepted: \"products\", \"nothing\" (name other \
                     ops with `CheckpointConfig::with_saving(Saving::Ops(..))`)"
                ))),
            },
            ("max", Value::Int(0)) => errors.push(error(
                "`max = 0` would refuse every checkpoint; give at least 1".into(),
            )),
            ("max", Value::Int(m)) => settings.max = Some(*m),
            ("replay", Value::Str(name)) => match syn::parse_str::<Ident>(name) {
                Ok(ident) => settings.replay = Some(Ident::new(&ident.to_string(), *value_span)),
                Err(_) => errors.push(error(format!(
                    "`replay = \"{name}\"` is not a function name"
                ))),
            },
            (_, Value::Path(path)) => settings.krate = path.clone(),
            _ => {}
        }
    }
    if policy_key.is_none() && errors.is_empty() {
        // Without a policy the checkpointer's configuration applies, precision, saving and limit
        // included.
        for found in found
            .iter()
            .filter(|f| matches!(f.key.as_str(), "precision" | "saving" | "max"))
        {
            errors.push(syn::Error::new(
                found.key_span,
                format!(
                    "`{}` goes with a policy (`every = N`, `policy = \"sqrt\"` or `memory = \
                     \"64 MiB\"`); without one, the checkpointer's own configuration applies",
                    found.key
                ),
            ));
        }
    }
    args::combine(errors).map(|()| settings)
}

/// Finds what would leave a layer step early: `return` and `?` anywhere outside nested closures and
/// async blocks, and `break`/`continue` that are labeled or outside an inner loop of the step.
#[derive(Default)]
struct ControlFlow {
    found: Option<Span>,
    inner_loops: usize,
}

impl ControlFlow {
    fn loop_body(&mut self, visit: impl FnOnce(&mut Self)) {
        self.inner_loops += 1;
        visit(self);
        self.inner_loops -= 1;
    }
}

impl<'ast> Visit<'ast> for ControlFlow {
    fn visit_expr_return(&mut self, e: &'ast syn::ExprReturn) {
        self.found.get_or_insert(e.span());
    }
    fn visit_expr_try(&mut self, e: &'ast syn::ExprTry) {
        self.found.get_or_insert(e.question_token.span());
    }
    fn visit_expr_break(&mut self, e: &'ast syn::ExprBreak) {
        if e.label.is_some() || self.inner_loops == 0 {
            self.found.get_or_insert(e.span());
        }
    }
    fn visit_expr_continue(&mut self, e: &'ast syn::ExprContinue) {
        if e.label.is_some() || self.inner_loops == 0 {
            self.found.get_or_insert(e.span());
        }
    }
    fn visit_expr_closure(&mut self, _: &'ast syn::ExprClosure) {}
    fn visit_expr_async(&mut self, _: &'ast syn::ExprAsync) {}
    fn visit_expr_for_loop(&mut self, e: &'ast syn::ExprForLoop) {
        self.loop_body(|v| syn::visit::visit_expr_for_loop(v, e));
    }
    fn visit_expr_while(&mut self, e: &'ast syn::ExprWhile) {
        self.loop_body(|v| syn::visit::visit_expr_while(v, e));
    }
    fn visit_expr_loop(&mut self, e: &'ast syn::ExprLoop) {
        self.loop_body(|v| syn::visit::visit_expr_loop(v, e));
    }
}

fn check_no_control_flow(block: &Block) -> syn::Result<()> {
    let mut finder = ControlFlow::default();
    finder.visit_block(block);
    match finder.found {
        Some(span) => Err(syn::Error::new(
            span,
            "#[checkpoint] runs each layer as one step of a checkpointed loop, so a layer's code \
             cannot `return`, `break`, `continue` or use `?`",
        )),
        None => Ok(()),
    }
}

/// The identifier a statement `name = ...;` assigns.
fn assigned(stmt: &Stmt) -> Option<&Ident> {
    let Stmt::Expr(Expr::Assign(assign), Some(_)) = stmt else {
        return None;
    };
    match &*assign.left {
        Expr::Path(p) if p.qself.is_none() => p.path.get_ident(),
        _ => None,
    }
}

/// The name and initial value of `let name = init;` (optionally typed, no `else`).
fn rebinding(stmt: &Stmt) -> Option<(&Ident, &Expr)> {
    binding(stmt).map(|(p, init)| (&p.ident, init))
}

/// The pattern (one name, maybe `mut`) and initial value of `let name = init;` (optionally
/// typed, no `else`).
fn binding(stmt: &Stmt) -> Option<(&syn::PatIdent, &Expr)> {
    let Stmt::Local(Local {
        pat,
        init: Some(init),
        ..
    }) = stmt
    else {
        return None;
    };
    if init.diverge.is_some() {
        return None;
    }
    let pat = match pat {
        Pat::Type(typed) => &*typed.pat,
        pat => pat,
    };
    match pat {
        Pat::Ident(p) if p.subpat.is_none() && p.by_ref.is_none() => Some((p, &init.expr)),
        _ => None,
    }
}

/// The single names an expression reads (`x`, not `self.x` or `a::x`), closures' and macros'
/// tokens included.
#[derive(Default)]
struct Names(Vec<Ident>);

impl<'ast> Visit<'ast> for Names {
    fn visit_expr_path(&mut self, e: &'ast syn::ExprPath) {
        if let (None, Some(ident)) = (&e.qself, e.path.get_ident()) {
            self.0.push(ident.clone());
        }
    }
    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        fn idents(tokens: TokenStream, out: &mut Vec<Ident>) {
            for tree in tokens {
                match tree {
                    proc_macro2::TokenTree::Ident(i) => out.push(i),
                    proc_macro2::TokenTree::Group(g) => idents(g.stream(), out),
                    _ => {}
                }
            }
        }
        idents(m.tokens.clone(), &mut self.0);
    }
}

/// Whether `expr` may give a chain's input, which a later `let` of another name reads: a call, a
/// method call, an operator or a macro (computing a tensor), or a variable; not a field, a
/// literal or a constant (`let g = self.groups;` before the layers is not the chain's input).
fn tensor_like(expr: &Expr) -> bool {
    match expr {
        Expr::Path(p) => p.qself.is_none() && p.path.get_ident().is_some(),
        Expr::Call(_) | Expr::MethodCall(_) | Expr::Binary(_) | Expr::Unary(_) | Expr::Macro(_) => {
            true
        }
        Expr::Reference(r) => tensor_like(&r.expr),
        Expr::Paren(p) => tensor_like(&p.expr),
        _ => false,
    }
}

fn names_in(expr: &Expr) -> Vec<Ident> {
    let mut names = Names::default();
    names.visit_expr(expr);
    names.0
}

/// The first of `names` that `stmts` read before a `let` binds it again, with where.
fn read_after<'n>(stmts: &[Stmt], names: &[&'n Ident]) -> Option<(&'n Ident, Span)> {
    let mut live: Vec<&Ident> = names.to_vec();
    for stmt in stmts {
        let mut read = Names::default();
        read.visit_stmt(stmt);
        for i in &read.0 {
            if let Some(name) = live.iter().find(|n| **n == i) {
                return Some((name, i.span()));
            }
        }
        if let Some((bound, _)) = rebinding(stmt) {
            live.retain(|n| *n != bound);
        }
    }
    None
}

/// The variable the function ends with (`... x }`), if it ends with one.
fn returned(func: &ItemFn) -> Option<&Ident> {
    match func.block.stmts.last() {
        Some(Stmt::Expr(Expr::Path(p), None)) if p.qself.is_none() => p.path.get_ident(),
        _ => None,
    }
}

/// The parameter the activation is first bound from (`let mut h = input;`), if any.
fn initialised_from<'f>(func: &'f ItemFn, act: &Ident) -> Option<&'f Ident> {
    func.block
        .stmts
        .iter()
        .find_map(|stmt| match rebinding(stmt) {
            Some((name, Expr::Path(p))) if name == act && p.qself.is_none() => p.path.get_ident(),
            _ => None,
        })
}

/// The `&mut Checkpointer` parameter, if any.
fn checkpointer_param(func: &ItemFn) -> Option<&Ident> {
    func.sig.inputs.iter().find_map(|arg| {
        let FnArg::Typed(typed) = arg else {
            return None;
        };
        let (Pat::Ident(pat), Type::Reference(r)) = (&*typed.pat, &*typed.ty) else {
            return None;
        };
        let Type::Path(p) = &*r.elem else {
            return None;
        };
        let is_ckpt = r.mutability.is_some()
            && p.path
                .segments
                .last()
                .is_some_and(|s| s.ident == "Checkpointer");
        is_ckpt.then_some(&pat.ident)
    })
}

/// The bytes of a budget written as a number and a unit (`"64 MiB"`, `"1.5 GB"`, `"4096"` bytes):
/// B, KB, MB, GB (powers of 1000) and KiB, MiB, GiB (powers of 1024).
fn bytes(text: &str) -> Result<usize, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '_'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let not_a_budget = || {
        format!(
            "`memory = \"{text}\"` is not a budget; give a number of bytes and a unit, such as \
             \"64 MiB\""
        )
    };
    if number.is_empty() {
        return Err(not_a_budget());
    }
    let scale: f64 = match unit.trim() {
        "" | "B" => 1.0,
        "KB" => 1e3,
        "MB" => 1e6,
        "GB" => 1e9,
        "KiB" => 1024.0,
        "MiB" => 1024.0 * 1024.0,
        "GiB" => 1024.0 * 1024.0 * 1024.0,
        other => {
            return Err(format!(
                "unknown unit `{other}` in `memory = \"{text}\"`; accepted: B, KB, MB, GB, KiB, \
                 MiB, GiB"
            ))
        }
    };
    match number.replace('_', "").parse::<f64>() {
        Ok(n) if n * scale >= 1.0 && n * scale < usize::MAX as f64 => Ok((n * scale) as usize),
        _ => Err(not_a_budget()),
    }
}

fn generate(settings: &Settings, mut func: ItemFn) -> syn::Result<TokenStream> {
    let krate = &settings.krate;
    let private = quote!(#krate::__private);
    let (policy, precision, saving) = (&settings.policy, &settings.precision, &settings.saving);
    let max = settings
        .max
        .map(|m| {
            let m = usize::try_from(m).unwrap_or(usize::MAX);
            quote!(.with_max_checkpoints(#m))
        })
        .unwrap_or_default();
    // Without a policy, the checkpointer's own configuration applies.
    let config = if policy.is_empty() {
        quote!(::core::option::Option::None)
    } else {
        // The site names the function, so that `memory = ...` keeps the costs it measured from
        // call to call without a checkpointer.
        quote! {
            ::core::option::Option::Some(
                #private::CheckpointConfig::new(#private::Policy::#policy)
                    .with_precision(#private::Precision::#precision)
                    .with_saving(#private::Saving::#saving)
                    #max
                    .at_site(::core::concat!(
                        ::core::module_path!(), ":", ::core::line!(), ":", ::core::column!()
                    ))
            )
        }
    };
    let ckpt = match checkpointer_param(&func) {
        Some(ident) => quote!(::core::option::Option::Some(&mut *#ident)),
        None => quote!(::core::option::Option::None),
    };
    // Named for what a borrow error says of it: a step's values live in the scope of their
    // segment, which a step's closure cannot let out (`history.push(x)` names this).
    let segment = Ident::new("scope_of_each_checkpointed_segment", Span::mixed_site());
    let run = |input: TokenStream, layers: TokenStream, reads: TokenStream, step, span: Span| {
        quote_spanned! {span=>
            #private::checkpoint_or_panic(#private::checkpoint_layers(
                #config, #ckpt, #input, #layers, #reads, #step,
            ))
        }
    };

    let ends_with = returned(&func).cloned();
    let stmts = &mut func.block.stmts;
    // The loop form: `for pat in iter { ...; act = ...; }`.
    let loop_at = stmts.iter().position(|s| match s {
        Stmt::Expr(Expr::ForLoop(f), _) => f.body.stmts.iter().any(|s| assigned(s).is_some()),
        _ => false,
    });
    if let Some(i) = loop_at {
        let Stmt::Expr(Expr::ForLoop(for_loop), _) = &stmts[i] else {
            unreachable!("found above");
        };
        if let Some(label) = &for_loop.label {
            return Err(syn::Error::new_spanned(
                label,
                "#[checkpoint] cannot keep a label on the layer loop",
            ));
        }
        check_no_control_flow(&for_loop.body)?;
        let mut candidates: Vec<&Ident> = for_loop.body.stmts.iter().filter_map(assigned).collect();
        candidates.dedup();
        let act = match (ends_with.as_ref(), candidates.as_slice()) {
            (Some(r), _) if candidates.contains(&r) => r.clone(),
            (_, [only]) => (*only).clone(),
            _ => {
                let names: Vec<String> = candidates.iter().map(|c| format!("`{c}`")).collect();
                return Err(syn::Error::new(
                    for_loop.span(),
                    format!(
                        "the layer loop assigns {}; #[checkpoint] takes the activation to be the \
                         variable the function ends with, so end it with one of them",
                        names.join(" and ")
                    ),
                ));
            }
        };
        let (pat, iter, body) = (&for_loop.pat, &for_loop.expr, &for_loop.body.stmts);
        // Made before the call, where the activation has not been moved yet (the loop could not
        // borrow the activation it reassigns). Not collected: a slice's or a range's iterator
        // knows its length, so the runtime plans without a `Vec` of the layers.
        let collected = mixed("layers");
        let layers = quote!(#collected);
        let step = quote!(|#segment, mut #act, _, #pat| { let _ = #segment; #(#body)* #act });
        let (all, index) = (mixed("layers"), mixed("index"));
        let replay_body = quote! {
            let #all: ::std::vec::Vec<_> = ::core::iter::IntoIterator::into_iter(#iter).collect();
            let #pat = match #all.get(#index) {
                ::core::option::Option::Some(layer) => ::core::clone::Clone::clone(layer),
                ::core::option::Option::None => ::core::panic!(
                    "layer {} is past the last of the {} layers", #index, #all.len()
                ),
            };
            let mut #act = ::core::clone::Clone::clone(#act);
            #(#body)*
            #act
        };
        let call = run(quote!(#act), layers, quote!(&[]), step, for_loop.span());
        stmts[i] = syn::parse2(quote! {
            {
                let #collected = ::core::iter::IntoIterator::into_iter(#iter);
                #act = #call;
            }
        })?;
        let replay = replay_fn(settings, &func, &act, replay_body)?;
        return Ok(quote!(#func #replay));
    }

    // The sequence form: `let`s in a row, each reading the one before (or rebinding its name),
    // the first giving the input; a `let` may also read earlier ones (skip connections).
    let runs: Vec<(usize, usize)> = (0..stmts.len())
        .filter_map(|start| {
            let (_, input) = rebinding(&stmts[start])?;
            let mut len = 1;
            while let (Some((before, _)), Some((name, init))) = (
                rebinding(&stmts[start + len - 1]),
                stmts.get(start + len).and_then(rebinding),
            ) {
                if name != before && (!names_in(init).contains(before) || !tensor_like(input)) {
                    break;
                }
                len += 1;
            }
            (len >= 2).then_some((start, len))
        })
        .collect();
    // Prefer the run that ends with the variable the function ends with, then the longest.
    let ends = |&&(start, len): &&(usize, usize)| {
        rebinding(&stmts[start + len - 1]).map(|(n, _)| n) == ends_with.as_ref()
    };
    let run_at = runs
        .iter()
        .find(ends)
        .or_else(|| runs.iter().rev().max_by_key(|&&(_, len)| len))
        .copied();
    if let Some((start, len)) = run_at {
        let lets: Vec<(&Ident, &Expr, bool)> = stmts[start..start + len]
            .iter()
            .map(|s| {
                let (pat, init) = binding(s).expect("found above");
                (&pat.ident, init, pat.mutability.is_some())
            })
            .collect();
        let steps = &lets[1..];
        for (_, step, _) in steps {
            check_no_control_flow(&syn::parse_quote!({ #step }))?;
        }
        // What each step reads: for the step at `p` (the `let` after `lets[p]`), the earlier
        // `let`s its names are bound by last, before `lets[p]`, whose value is its input.
        let reads: Vec<Vec<usize>> = steps
            .iter()
            .enumerate()
            .map(|(p, (_, expr, _))| {
                let names = names_in(expr);
                let mut read: Vec<usize> = names
                    .iter()
                    .filter_map(|n| (0..=p).rev().find(|&q| lets[q].0 == n))
                    .filter(|&q| q < p)
                    .collect();
                read.sort_unstable();
                read.dedup();
                read
            })
            .collect();
        let skipping = reads.iter().any(|r| !r.is_empty());
        if skipping {
            if let Some(name) = &settings.replay {
                return Err(syn::Error::new(
                    name.span(),
                    "`replay` runs one layer from its input alone, and a `let` of this sequence \
                     reads an earlier one (a skip connection): leave `replay` out",
                ));
            }
        }
        // A value inside the chain is gone once it has run: only its last `let` is bound after.
        let last = &lets[len - 1].0.clone();
        let inner: Vec<&Ident> = lets[1..len - 1]
            .iter()
            .map(|(n, ..)| *n)
            .filter(|n| *n != last)
            .collect();
        let after = &stmts[start + len..];
        if let Some((name, span)) = read_after(after, &inner) {
            return Err(syn::Error::new(
                span,
                format!(
                    "`{name}` is a value inside the #[checkpoint] sequence, which is not kept \
                     after it; only the sequence's last `let` (`{last}`) and its first (the \
                     input) can be read after it"
                ),
            ));
        }
        let first = lets[0].0.clone();
        let input = match first != *last && read_after(after, &[&first]).is_some() {
            true => quote!(::core::clone::Clone::clone(&#first)),
            false => quote!(#first),
        };
        let (act, skips) = (mixed("activation"), mixed("skips"));
        let bindings = |p: usize, from: TokenStream| {
            let (name, _, mutable) = lets[p];
            let mutable = mutable.then(|| quote!(mut));
            let read = reads[p].iter().enumerate().map(|(k, &q)| {
                let skip = lets[q].0;
                quote!(let #skip = ::core::clone::Clone::clone(&#skips[#k]);)
            });
            quote! {
                #(#read)*
                #[allow(unused_variables, unused_mut)]
                let #mutable #name = #from;
            }
        };
        let count = steps.len();
        let arms = steps.iter().enumerate().map(|(p, (_, expr, _))| {
            let bound = bindings(p, quote!(#act));
            let pat = if p + 1 == count {
                quote!(_)
            } else {
                quote!(#p)
            };
            quote!(#pat => { #bound #expr })
        });
        let index = Ident::new("__tensorscope_layer", Span::mixed_site());
        let layers = quote!(0..#count);
        let step = quote! {
            |#segment, #act, #skips, #index: usize| {
                let _ = (#segment, #skips);
                match #index { #(#arms)* }
            }
        };
        let reads_list = reads.iter().map(|r| quote!(&[#(#r),*]));
        let reads_tokens = match skipping {
            true => quote!(&[#(#reads_list),*]),
            false => quote!(&[]),
        };
        let index = mixed("index");
        let replay_arms = steps.iter().enumerate().map(|(p, (_, expr, _))| {
            let bound = bindings(p, quote!(::core::clone::Clone::clone(#first)));
            quote!(#p => { #bound #expr })
        });
        let replay_body = quote! {
            match #index {
                #(#replay_arms)*
                _ => ::core::panic!("layer {} is past the last of the {} layers", #index, #count),
            }
        };
        let call = run(input, layers, reads_tokens, step, stmts[start + 1].span());
        let mutable = lets[len - 1].2.then(|| quote!(mut));
        let replacement: Stmt = syn::parse2(quote!(let #mutable #last = #call;))?;
        stmts.splice(start + 1..start + len, [replacement]);
        let replay = replay_fn(settings, &func, &first, replay_body)?;
        return Ok(quote!(#func #replay));
    }

    Err(syn::Error::new(
        func.sig.ident.span(),
        "#[checkpoint] found no layer loop or sequence in this function: write a `for` loop over \
         the layers that reassigns the activation (`for layer in &self.layers { x = \
         layer.forward(&x); }`) or a sequence of `let`s, each reading the one before it (`let h \
         = self.conv_in.forward(&x); let d = self.down.forward(&h); ...`; a `let` may also read \
         earlier ones, as skip connections do)",
    ))
}

/// An identifier the user's code cannot see or clash with.
fn mixed(name: &str) -> Ident {
    Ident::new(name, Span::mixed_site())
}

/// The `replay = "name"` function: the same receiver and parameters as `func` (without the
/// checkpointer and the activation), then the activation `act: &Tensor<'r, E>` and `index`, returning
/// layer `index`'s output. `E` comes from `func`'s return type, which must be the activation tensor.
fn replay_fn(
    settings: &Settings,
    func: &ItemFn,
    act: &Ident,
    body: TokenStream,
) -> syn::Result<TokenStream> {
    let Some(name) = &settings.replay else {
        return Ok(TokenStream::new());
    };
    let krate = &settings.krate;
    let private = quote!(#krate::__private);
    let syn::ReturnType::Type(_, ret) = &func.sig.output else {
        return Err(syn::Error::new(
            name.span(),
            "`replay` needs the function to return the activation tensor",
        ));
    };
    let Some(tensor) = (match &**ret {
        Type::Path(p) => p.path.segments.last().filter(|s| s.ident == "Tensor"),
        _ => None,
    }) else {
        return Err(syn::Error::new_spanned(
            ret,
            "`replay` needs the function to return the activation tensor (`Tensor<'a, ..>`)",
        ));
    };
    let elem: Vec<&Type> = match &tensor.arguments {
        syn::PathArguments::AngleBracketed(a) => a
            .args
            .iter()
            .filter_map(|g| match g {
                syn::GenericArgument::Type(t) => Some(t),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    };
    let brand = syn::Lifetime::new("'__tensorscope_replay", Span::mixed_site());
    let mut generics = func.sig.generics.clone();
    // Everything the function borrows outlives the replayed activation's brand.
    let outlives: Vec<syn::WherePredicate> = generics
        .lifetimes()
        .map(|l| {
            let l = &l.lifetime;
            syn::parse_quote!(#l: #brand)
        })
        .collect();
    generics.make_where_clause().predicates.extend(outlives);
    generics.params.insert(
        0,
        syn::GenericParam::Lifetime(syn::LifetimeParam::new(brand.clone())),
    );
    let (impl_generics, _, where_clause) = generics.split_for_impl();
    let ckpt = checkpointer_param(func);
    let source = initialised_from(func, act);
    let inputs = func.sig.inputs.iter().filter(|arg| match arg {
        FnArg::Typed(t) => match &*t.pat {
            Pat::Ident(p) => p.ident != *act && Some(&p.ident) != ckpt && Some(&p.ident) != source,
            _ => true,
        },
        FnArg::Receiver(_) => true,
    });
    let vis = &func.vis;
    let doc = format!(
        "Runs layer `index` of `{}` on `{act}`: the replay that `Checkpointer::reverse` and \
         `recompute_from_checkpoint` take. Generated by `#[checkpoint]`.",
        func.sig.ident
    );
    let index = mixed("index");
    Ok(quote! {
        #[doc = #doc]
        #[allow(unused_variables, clippy::too_many_arguments)]
        #vis fn #name #impl_generics (
            #(#inputs,)*
            #act: &#private::Tensor<#brand #(, #elem)*>,
            #index: usize,
        ) -> #private::Tensor<#brand #(, #elem)*> #where_clause {
            #body
        }
    })
}
