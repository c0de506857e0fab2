//! `#[derive(Escape)]` for structs with one lifetime parameter.

use proc_macro2::TokenStream;
use quote::{format_ident, quote};
use syn::visit::Visit;
use syn::{Data, DeriveInput, Fields, GenericParam, Lifetime, Path};

use crate::args::{self, Accepted, Kind, Options, Value};

const OPTIONS: Options = Options {
    attr: "#[escape(..)]",
    accepted: &[Accepted {
        name: "crate",
        kind: Kind::Path,
        value: "the path of the tensorscope crate as a string",
        example: "crate = \"my_reexports::tensorscope\"",
    }],
};

/// The tensorscope path: `::tensorscope`, or what `#[escape(crate = "..")]` names.
fn crate_path(input: &DeriveInput) -> syn::Result<Path> {
    let mut krate: Path = syn::parse_quote!(::tensorscope);
    for attr in input.attrs.iter().filter(|a| a.path().is_ident("escape")) {
        let tokens = attr.meta.require_list()?.tokens.clone();
        let mut errors = Vec::new();
        for (_, _, value) in args::parse(&OPTIONS, tokens, &mut errors) {
            if let Value::Path(path) = value {
                krate = path;
            }
        }
        args::combine(errors)?;
    }
    Ok(krate)
}

pub(crate) fn derive(input: TokenStream) -> TokenStream {
    match syn::parse2::<DeriveInput>(input).and_then(|input| generate(&input)) {
        Ok(tokens) => tokens,
        Err(error) => error.into_compile_error(),
    }
}

fn mentions(ty: &syn::Type, lifetime: &Lifetime) -> bool {
    struct Finder<'l>(&'l Lifetime, bool);
    impl<'ast> Visit<'ast> for Finder<'_> {
        fn visit_lifetime(&mut self, l: &'ast Lifetime) {
            self.1 |= l.ident == self.0.ident;
        }
    }
    let mut finder = Finder(lifetime, false);
    finder.visit_type(ty);
    finder.1
}

fn generate(input: &DeriveInput) -> syn::Result<TokenStream> {
    let Data::Struct(data) = &input.data else {
        return Err(syn::Error::new_spanned(
            &input.ident,
            "derive(Escape) supports structs; escape the fields of an enum by matching on it",
        ));
    };
    let krate = crate_path(input)?;
    let name = &input.ident;
    let lifetimes: Vec<&Lifetime> = input.generics.lifetimes().map(|l| &l.lifetime).collect();
    let to = Lifetime::new("'__escape_to", proc_macro2::Span::mixed_site());
    let mut with_target = input.generics.clone();
    with_target.params.insert(
        0,
        GenericParam::Lifetime(syn::LifetimeParam::new(to.clone())),
    );
    let (impl_generics, _, _) = with_target.split_for_impl();
    let (_, ty_generics, where_clause) = input.generics.split_for_impl();
    if lifetimes.is_empty() {
        // No brand, so no scoped tensor inside: the value passes through unchanged.
        return Ok(quote! {
            #[automatically_derived]
            impl #impl_generics #krate::Escape<#to> for #name #ty_generics #where_clause {
                type Escaped = Self;
                fn escape_to(self, _: &#krate::EscapeTarget<#to>) -> Self {
                    self
                }
            }
        });
    }
    let [brand] = lifetimes[..] else {
        return Err(syn::Error::new_spanned(
            &input.generics,
            "derive(Escape) needs at most one lifetime parameter, the scope brand, as in \
             `struct Output<'s> { y: Tensor<'s> }`",
        ));
    };
    let target = format_ident!("__target", span = proc_macro2::Span::mixed_site());

    // `Output<'a, T>` -> `Output<'__escape_to, T>` for the escaped type.
    let escaped_args = input.generics.params.iter().map(|p| match p {
        GenericParam::Lifetime(_) => quote!(#to),
        GenericParam::Type(t) => {
            let ident = &t.ident;
            quote!(#ident)
        }
        GenericParam::Const(c) => {
            let ident = &c.ident;
            quote!(#ident)
        }
    });
    let field = |ty: &syn::Type, access: TokenStream| {
        if mentions(ty, brand) {
            quote!(#krate::Escape::escape_to(#access, #target))
        } else {
            access
        }
    };
    let construct = match &data.fields {
        Fields::Named(fields) => {
            let inits = fields.named.iter().map(|f| {
                let ident = &f.ident;
                let value = field(&f.ty, quote!(self.#ident));
                quote!(#ident: #value)
            });
            quote!(#name { #(#inits),* })
        }
        Fields::Unnamed(fields) => {
            let inits = fields.unnamed.iter().enumerate().map(|(i, f)| {
                let index = syn::Index::from(i);
                field(&f.ty, quote!(self.#index))
            });
            quote!(#name(#(#inits),*))
        }
        Fields::Unit => quote!(#name),
    };
    Ok(quote! {
        #[automatically_derived]
        impl #impl_generics #krate::Escape<#to> for #name #ty_generics #where_clause {
            type Escaped = #name<#(#escaped_args),*>;
            fn escape_to(self, #target: &#krate::EscapeTarget<#to>) -> Self::Escaped {
                #construct
            }
        }
    })
}
