//! `#[dispose_scope]`: the body runs in a child scope; tensor parameters are rebound into it and the
//! return value is escaped on every path.

use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;
use syn::visit_mut::VisitMut;
use syn::{FnArg, Ident, ItemFn, Lifetime, Pat, PatIdent, Path, ReturnType, Type};

use crate::args::{self, Accepted, Options, Value};

const OPTIONS: Options = Options {
    attr: "#[dispose_scope]",
    accepted: &[
        Accepted {
            name: "max_memory_mb",
            value: "a whole number of MiB, at least 1",
            example: "max_memory_mb = 256",
        },
        Accepted {
            name: "crate",
            value: "the path of the tensorscope crate as a string",
            example: "crate = \"my_reexports::tensorscope\"",
        },
    ],
};

pub(crate) fn expand(args: TokenStream, item: TokenStream) -> TokenStream {
    let func = match syn::parse2::<ItemFn>(item.clone()) {
        Ok(func) => func,
        Err(_) => {
            let error = syn::Error::new(
                first_token_span(&item),
                "#[dispose_scope] applies to a function or method with a body",
            );
            return with_item(error, item);
        }
    };
    match settings(args, &func).and_then(|s| generate(&s, func)) {
        Ok(tokens) => tokens,
        Err(error) => with_item(error, item),
    }
}

/// The error, and the user's item unchanged so that one mistake does not cascade.
fn with_item(error: syn::Error, item: TokenStream) -> TokenStream {
    let error = error.into_compile_error();
    quote!(#error #item)
}

fn first_token_span(item: &TokenStream) -> Span {
    item.clone()
        .into_iter()
        .next()
        .map_or_else(Span::call_site, |t| t.span())
}

struct Settings {
    max_memory_mb: Option<u64>,
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
    match args::parse(&OPTIONS, args) {
        Ok(found) => {
            for (key, span, value) in found {
                match (key.as_str(), value) {
                    ("max_memory_mb", Value::Int(0)) => errors.push(syn::Error::new(
                        span,
                        "`max_memory_mb = 0` would fail every rent; give at least 1 (MiB)",
                    )),
                    ("max_memory_mb", Value::Int(n)) => settings.max_memory_mb = Some(n),
                    (_, Value::Path(path)) => settings.krate = path,
                    (_, Value::Int(_)) => unreachable!("only max_memory_mb takes a number"),
                }
            }
        }
        Err(e) => errors.push(e),
    }
    match errors.into_iter().reduce(|mut a, b| {
        a.combine(b);
        a
    }) {
        Some(e) => Err(e),
        None => Ok(settings),
    }
}

/// How a parameter takes part: the scope to open a child of, or a tensor to rebind.
enum Param {
    Scope(Ident),
    TensorRef(Ident),
    TensorOwned(PatIdent),
}

fn last_segment_is(ty: &Type, name: &str) -> bool {
    matches!(ty, Type::Path(p) if p.qself.is_none()
        && p.path.segments.last().is_some_and(|s| s.ident == name))
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
    match &*typed.ty {
        Type::Reference(r) if r.mutability.is_none() && last_segment_is(&r.elem, "Scope") => {
            Some(Param::Scope(pat.ident.clone()))
        }
        Type::Reference(r) if r.mutability.is_none() && last_segment_is(&r.elem, "Tensor") => {
            Some(Param::TensorRef(pat.ident.clone()))
        }
        ty if last_segment_is(ty, "Tensor") => Some(Param::TensorOwned(pat.clone())),
        _ => None,
    }
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

fn contains_impl_trait(ty: &Type) -> bool {
    struct Finder(bool);
    impl<'ast> syn::visit::Visit<'ast> for Finder {
        fn visit_type_impl_trait(&mut self, _: &'ast syn::TypeImplTrait) {
            self.0 = true;
        }
    }
    let mut finder = Finder(false);
    syn::visit::visit_type(&mut finder, ty);
    finder.0
}

fn generate(settings: &Settings, mut func: ItemFn) -> syn::Result<TokenStream> {
    let krate = &settings.krate;
    let private = quote!(#krate::__private);
    let scope = Ident::new("__tensorscope_scope", Span::mixed_site());
    let params: Vec<Param> = func.sig.inputs.iter().filter_map(classify).collect();

    let parent = params
        .iter()
        .find_map(|p| match p {
            Param::Scope(ident) => Some(quote!(#private::Parent::of_scope(#ident))),
            _ => None,
        })
        .or_else(|| {
            params.iter().find_map(|p| match p {
                Param::TensorRef(ident) => Some(quote!(#private::Parent::of_tensor(#ident))),
                Param::TensorOwned(pat) => {
                    let ident = &pat.ident;
                    Some(quote!(#private::Parent::of_tensor(&#ident)))
                }
                Param::Scope(_) => None,
            })
        })
        .unwrap_or_else(|| quote!(#private::Parent::current()));

    let rebinds = params.iter().map(|p| match p {
        Param::Scope(ident) => quote!(let #ident = #scope;),
        Param::TensorRef(ident) => quote!(let #ident = &#scope.rebind(#ident);),
        Param::TensorOwned(pat) => {
            let (mutability, ident) = (&pat.mutability, &pat.ident);
            quote!(let #mutability #ident = #scope.rebind_owned(#ident);)
        }
    });

    let budget = match settings.max_memory_mb {
        Some(mb) => {
            let mb = mb as usize;
            quote!(::core::option::Option::Some(#private::mib(#mb)))
        }
        None => quote!(::core::option::Option::None),
    };

    let (outer_ret, inner_ret) = match &func.sig.output {
        ReturnType::Type(_, ty) if contains_impl_trait(ty) => (quote!(), quote!()),
        ReturnType::Type(_, ty) => {
            let mut elided = (**ty).clone();
            ElideLifetimes.visit_type_mut(&mut elided);
            (quote!(-> #ty), quote_spanned!(ty.span()=> -> #elided))
        }
        ReturnType::Default => (quote!(-> ()), quote!(-> ())),
    };

    let body = &func.block;
    let stmts = &body.stmts;
    let new_body = quote_spanned! {body.span()=>
        {
            #parent.open(#budget, |#scope| #outer_ret {
                #(#rebinds)*
                #scope.escape(#private::call(|| #inner_ret { #(#stmts)* }))
            })
        }
    };
    *func.block = syn::parse2(new_body)?;
    Ok(quote!(#func))
}
