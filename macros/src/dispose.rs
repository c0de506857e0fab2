//! `#[dispose_scope]`: the body runs in a child scope; tensor parameters are rebound into it and the
//! return value is escaped on every path.

use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;
use syn::visit_mut::VisitMut;
use syn::{FnArg, Ident, ItemFn, Lifetime, Pat, PatIdent, Path, ReturnType, Type};

use crate::args::{self, Accepted, Kind as ValueKind, Options, Value};
use crate::item;

const OPTIONS: Options = Options {
    attr: "#[dispose_scope]",
    accepted: &[
        Accepted {
            name: "max_memory_mb",
            kind: ValueKind::Int,
            value: "a whole number of MiB, at least 1",
            example: "max_memory_mb = 256",
        },
        Accepted {
            name: "crate",
            kind: ValueKind::Path,
            value: "the path of the tensorscope crate as a string",
            example: "crate = \"my_reexports::tensorscope\"",
        },
    ],
};

pub(crate) fn expand(args: TokenStream, item: TokenStream) -> TokenStream {
    item::expand_fn("#[dispose_scope]", item, |func| {
        let settings = settings(args, &func)?;
        generate(&settings, func)
    })
}

struct Settings {
    max_memory_mb: Option<usize>,
    krate: Path,
}

fn settings(args: TokenStream, func: &ItemFn) -> syn::Result<Settings> {
    let mut errors = Vec::new();
    if let Some(token) = func.sig.asyncness {
        errors.push(syn::Error::new(
            token.span(),
            "#[dispose_scope] does not support `async fn`: a scope and its tensors cannot be held \
             across an `.await`; annotate the synchronous forward it calls instead",
        ));
    }
    if let Some(token) = func.sig.constness {
        errors.push(syn::Error::new(
            token.span(),
            "#[dispose_scope] does not support `const fn`: scopes are opened at run time",
        ));
    }
    let mut settings = Settings {
        max_memory_mb: None,
        krate: syn::parse_quote!(::tensorscope),
    };
    // `max_memory_mb` is the only number and `crate` the only path (see `OPTIONS`).
    for found in args::parse(&OPTIONS, args, &mut errors) {
        let span = found.value_span;
        match found.value {
            Value::Int(0) => errors.push(syn::Error::new(
                span,
                "`max_memory_mb = 0` would fail every rent; give at least 1 (MiB)",
            )),
            Value::Int(n) => match usize::try_from(n) {
                Ok(n) => settings.max_memory_mb = Some(n),
                Err(_) => errors.push(syn::Error::new(
                    span,
                    "`max_memory_mb` does not fit this target's `usize`",
                )),
            },
            Value::Path(path) => settings.krate = path,
            Value::Str(_) => {} // no string option here
        }
    }
    args::combine(errors).map(|()| settings)
}

/// How a parameter takes part: the scope to open a child of, or a tensor to rebind.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Scope,
    TensorRef,
    TensorOwned,
}

/// A parameter the macro works with: its binding, its kind, and its brand lifetime (the first
/// lifetime argument of `Scope<'a, ..>` or of `Tensor<'a, ..>`).
struct Param {
    pat: PatIdent,
    kind: Kind,
    brand: Option<String>,
}

/// The type inside invisible groups (from `macro_rules!` `$t:ty`) and parentheses.
fn peel(ty: &Type) -> &Type {
    match ty {
        Type::Group(g) => peel(&g.elem),
        Type::Paren(p) => peel(&p.elem),
        _ => ty,
    }
}

/// The last path segment of `ty` if it is named `name`.
fn segment_named<'t>(ty: &'t Type, name: &str) -> Option<&'t syn::PathSegment> {
    match peel(ty) {
        Type::Path(p) if p.qself.is_none() => p.path.segments.last().filter(|s| s.ident == name),
        _ => None,
    }
}

/// Whether `ty` is a path through a module named `thread` (`std::thread::Scope`).
fn is_thread(ty: &Type) -> bool {
    match peel(ty) {
        Type::Path(p) => p.path.segments.iter().any(|s| s.ident == "thread"),
        _ => false,
    }
}

/// The named lifetime arguments of `segment`, `'_` excluded.
fn lifetime_args(segment: &syn::PathSegment) -> Vec<String> {
    match &segment.arguments {
        syn::PathArguments::AngleBracketed(a) => a
            .args
            .iter()
            .filter_map(|g| match g {
                syn::GenericArgument::Lifetime(l) if l.ident != "_" => Some(l.ident.to_string()),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    }
}

fn classify(arg: &FnArg) -> Option<Param> {
    let FnArg::Typed(typed) = arg else {
        return None;
    };
    let Pat::Ident(pat) = &*typed.pat else {
        return None;
    };
    if pat.by_ref.is_some() || pat.subpat.is_some() {
        return None;
    }
    let param = |kind, brand| {
        Some(Param {
            pat: pat.clone(),
            kind,
            brand,
        })
    };
    match peel(&typed.ty) {
        Type::Reference(r) if r.mutability.is_none() => {
            if let Some(seg) = segment_named(&r.elem, "Scope").filter(|_| !is_thread(&r.elem)) {
                return param(Kind::Scope, lifetime_args(seg).into_iter().next());
            }
            let seg = segment_named(&r.elem, "Tensor")?;
            param(Kind::TensorRef, lifetime_args(seg).into_iter().next())
        }
        ty => {
            let seg = segment_named(ty, "Tensor")?;
            param(Kind::TensorOwned, lifetime_args(seg).into_iter().next())
        }
    }
}

/// The named lifetimes in `ty`, `'static` and `'_` excluded.
fn named_lifetimes(ty: &Type) -> Vec<String> {
    struct Finder(Vec<String>);
    impl<'ast> syn::visit::Visit<'ast> for Finder {
        fn visit_lifetime(&mut self, l: &'ast Lifetime) {
            if l.ident != "static" && l.ident != "_" {
                self.0.push(l.ident.to_string());
            }
        }
    }
    let mut finder = Finder(Vec::new());
    syn::visit::visit_type(&mut finder, ty);
    finder.0
}

/// Whether `ty` has any lifetime at all, elided `'_` and `'static` included.
fn has_lifetime(ty: &Type) -> bool {
    struct Finder(bool);
    impl<'ast> syn::visit::Visit<'ast> for Finder {
        fn visit_lifetime(&mut self, _: &'ast Lifetime) {
            self.0 = true;
        }
    }
    let mut finder = Finder(false);
    syn::visit::visit_type(&mut finder, ty);
    finder.0
}

/// Replaces every named lifetime but `'static` with `'_`, so a closure's return type can be
/// annotated with the function's return type re-branded to whatever scope the body runs in.
struct ElideLifetimes;

impl VisitMut for ElideLifetimes {
    fn visit_lifetime_mut(&mut self, lifetime: &mut Lifetime) {
        if lifetime.ident != "static" {
            *lifetime = Lifetime::new("'_", lifetime.span());
        }
    }
}

/// Whether the inner closure's return type cannot be written out: `impl Trait` is not allowed
/// there, and `Self` would keep the caller's brand.
fn unannotatable(ty: &Type) -> bool {
    struct Finder(bool);
    impl<'ast> syn::visit::Visit<'ast> for Finder {
        fn visit_type_impl_trait(&mut self, _: &'ast syn::TypeImplTrait) {
            self.0 = true;
        }
        fn visit_path_segment(&mut self, segment: &'ast syn::PathSegment) {
            self.0 |= segment.ident == "Self";
            syn::visit::visit_path_segment(self, segment);
        }
    }
    let mut finder = Finder(false);
    syn::visit::visit_type(&mut finder, ty);
    finder.0
}

/// Checks what the expansion cannot support.
fn check_supported(func: &ItemFn) -> syn::Result<()> {
    if let ReturnType::Type(_, ty) = &func.sig.output {
        if matches!(peel(ty), Type::Never(_)) {
            return Err(syn::Error::new_spanned(
                ty,
                "#[dispose_scope] needs a function that returns: `-> !` has no value to escape",
            ));
        }
    }
    if let Some(attr) = func
        .attrs
        .iter()
        .find(|a| a.path().is_ident("track_caller"))
    {
        return Err(syn::Error::new_spanned(
            attr,
            "#[track_caller] cannot be combined with #[dispose_scope]: the body runs in a closure, \
             so the caller's location would be lost",
        ));
    }
    Ok(())
}

/// The named lifetimes of the return type, each once.
fn returned_brands(output: &ReturnType) -> Vec<String> {
    let ReturnType::Type(_, ty) = output else {
        return Vec::new();
    };
    let mut returned = named_lifetimes(ty);
    returned.dedup();
    returned
}

/// The parameter whose scope the child is opened in, or `None` for a new outermost scope on the
/// current pool (only for a return type that holds no brand).
fn parent_param<'p>(params: &'p [Param], output: &ReturnType) -> syn::Result<Option<&'p Param>> {
    let ReturnType::Type(_, ty) = output else {
        return Ok(params.first());
    };
    let returned = returned_brands(output);
    if returned.is_empty() {
        let parent = params
            .iter()
            .find(|p| p.kind == Kind::Scope)
            .or(params.first());
        if parent.is_none() && has_lifetime(ty) {
            return Err(syn::Error::new_spanned(
                ty,
                "#[dispose_scope] cannot tell which scope the result belongs to: the return type \
                 has a lifetime, but no `&Scope` or tensor parameter carries a brand (a `Param` \
                 carries none); add a parameter `s: &Scope<'a, '_>` and return `Tensor<'a>`, or \
                 return values without a brand (`Param`, numbers, `Vec<f32>`)",
            ));
        }
        return Ok(parent);
    }
    let carried: Vec<&String> = returned
        .iter()
        .filter(|l| params.iter().any(|p| p.brand.as_ref() == Some(*l)))
        .collect();
    if let [first, second, ..] = carried[..] {
        return Err(syn::Error::new_spanned(
            ty,
            format!(
                "#[dispose_scope] escapes the result to one scope, but the return type names two \
                 brands, `'{first}` and `'{second}`, each carried by a parameter; return tensors \
                 of one of them (escape to the outer one: `Tensor<'{first}>` for both, if `'{first}` \
                 is the outer scope)"
            ),
        ));
    }
    let mut carrying: Vec<&Param> = params
        .iter()
        .filter(|p| p.brand.as_ref().is_some_and(|b| returned.contains(b)))
        .collect();
    carrying.sort_by_key(|p| p.kind != Kind::Scope);
    match carrying.first() {
        Some(p) => Ok(Some(p)),
        None => Err(syn::Error::new_spanned(
            ty,
            format!(
                "#[dispose_scope] cannot tell which scope the result belongs to: the return type \
                 names `'{}`, but no `&Scope<'{0}, '_>` or `Tensor<'{0}>`/`&Tensor<'{0}>` parameter \
                 carries it (a `Param` carries no brand; tensors inside slices, options, type \
                 aliases or `self` are not looked into); add a parameter `s: &Scope<'{0}, '_>`",
                returned[0]
            ),
        )),
    }
}

fn generate(settings: &Settings, mut func: ItemFn) -> syn::Result<TokenStream> {
    check_supported(&func)?;
    let krate = &settings.krate;
    let private = quote!(#krate::__private);
    let scope = Ident::new("function_scope", Span::mixed_site());
    let params: Vec<Param> = func.sig.inputs.iter().filter_map(classify).collect();
    let parent_param = parent_param(&params, &func.sig.output)?;

    // A tensor as a reference, whatever form its parameter has.
    let tensor_ref = |param: &Param| {
        let ident = &param.pat.ident;
        match param.kind {
            Kind::TensorOwned => quote!(&#ident),
            _ => quote!(#ident),
        }
    };
    let open = match parent_param {
        Some(param) if param.kind == Kind::Scope => {
            let ident = &param.pat.ident;
            quote!(#private::Parent::of_scope(#ident).open)
        }
        // The deepest scope of the tensor parameters whose brands outlive the result's (those
        // rebound, and those of the result's own brand): the caller's innermost scope among them,
        // whichever argument it came in.
        Some(param) => {
            let first = tensor_ref(param);
            // A parameter named `_x` is not rebound, so its brand is known to outlive the
            // result's only when it is the result's own.
            let returned = returned_brands(&func.sig.output);
            let others = params
                .iter()
                .filter(|p| p.kind != Kind::Scope && !std::ptr::eq(*p, param))
                .filter(|p| {
                    !p.pat.ident.to_string().starts_with('_')
                        || p.brand.as_ref().is_some_and(|b| returned.contains(b))
                })
                .map(tensor_ref);
            quote!(#private::Parent::of_tensor(#first)#(.or_deeper(#others))*.open)
        }
        None => quote!(#private::open_root),
    };

    // The chosen scope parameter becomes the child; tensor parameters are rebound into it, except
    // those named `_x` (unused by convention). `mut` moves from the parameter to the rebinding.
    let parent_ident = parent_param.map(|p| &p.pat.ident);
    let rebinds: Vec<TokenStream> = params
        .iter()
        .filter(|p| !p.pat.ident.to_string().starts_with('_'))
        .filter_map(|p| {
            let (mutability, ident) = (&p.pat.mutability, &p.pat.ident);
            match p.kind {
                Kind::Scope if Some(ident) == parent_ident => Some(quote!(let #ident = #scope;)),
                Kind::Scope => None,
                // Spanned at the parameter: a brand that does not outlive the result's scope is
                // reported there.
                Kind::TensorRef => Some(
                    quote_spanned!(ident.span()=> let #mutability #ident = &#scope.rebind(#ident);),
                ),
                Kind::TensorOwned => Some(
                    quote_spanned!(ident.span()=> let #mutability #ident = #scope.rebind_owned(#ident);),
                ),
            }
        })
        .collect();
    let rebound: Vec<Ident> = params
        .iter()
        .filter(|p| !p.pat.ident.to_string().starts_with('_') && p.kind != Kind::Scope)
        .map(|p| p.pat.ident.clone())
        .collect();
    for arg in &mut func.sig.inputs {
        if let FnArg::Typed(typed) = arg {
            if let Pat::Ident(pat) = &mut *typed.pat {
                if rebound.contains(&pat.ident) {
                    pat.mutability = None;
                }
            }
        }
    }

    let budget = match settings.max_memory_mb {
        Some(mb) => quote!(::core::option::Option::Some(#private::mib(#mb))),
        None => quote!(::core::option::Option::None),
    };

    let (outer_ret, inner_ret, escapes) = match &func.sig.output {
        ReturnType::Type(_, ty) if unannotatable(ty) => (quote!(), quote!(), true),
        ReturnType::Type(_, ty) => {
            let mut elided = (**ty).clone();
            ElideLifetimes.visit_type_mut(&mut elided);
            (
                quote!(-> #ty),
                quote_spanned!(ty.span()=> -> #elided),
                has_lifetime(ty),
            )
        }
        ReturnType::Default => (quote!(-> ()), quote!(-> ()), false),
    };

    let body = &func.block;
    let stmts = &body.stmts;
    let run_body = quote!(#private::call(|| #inner_ret { #(#stmts)* }));
    // A return type without any lifetime holds no scoped tensor, so it needs no escape (and need not
    // implement `Escape`); if a brand hides in it, the borrow checker still refuses the body.
    let result = match &func.sig.output {
        // The escaped value is a variable located at the return type, so "cannot be escaped"
        // points at the type to fix.
        ReturnType::Type(_, ty) if escapes => {
            // Call-site hygiene: rustc shows spans of the macro's own context at the attribute.
            let value = Ident::new("__tensorscope_value", ty.span());
            quote_spanned!(ty.span()=> { let #value = #run_body; #scope.escape(#value) })
        }
        _ => run_body,
    };
    // The scope's name in a trace: the function's path, a `&'static str` made at compile time.
    let fn_name = syn::ext::IdentExt::unraw(&func.sig.ident).to_string();
    let name = quote!(::core::concat!(::core::module_path!(), "::", #fn_name));
    let new_body = quote_spanned! {body.span()=>
        {
            #open(#name, #budget, |#scope| #outer_ret {
                #(#rebinds)*
                #result
            })
        }
    };
    *func.block = syn::parse2(new_body)?;
    Ok(quote!(#func))
}
