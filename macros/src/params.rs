//! `#[derive(Parameters)]`: a model struct's parameters walked by field, named by field path.

use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned, ToTokens};
use syn::meta::ParseNestedMeta;
use syn::spanned::Spanned;
use syn::{Data, DeriveInput, GenericParam, LitStr, Path, Type, TypeParamBound};

use crate::args::{self, Accepted, Kind, Options, Value};

const OPTIONS: Options = Options {
    attr: "#[param(..)] on the struct",
    accepted: &[
        Accepted {
            name: "crate",
            kind: Kind::Path,
            value: "the path of the tensorscope crate as a string",
            example: "crate = \"my_reexports::tensorscope\"",
        },
        Accepted {
            name: "element",
            kind: Kind::Path,
            value: "the element type of the parameters as a string",
            example: "element = \"f64\"",
        },
    ],
};

const FIELD_OPTIONS: Options = Options {
    attr: "#[param(..)] on a field",
    accepted: &[
        Accepted {
            name: "skip",
            kind: Kind::Flag,
            value: "no value",
            example: "skip",
        },
        Accepted {
            name: "flatten",
            kind: Kind::Flag,
            value: "no value",
            example: "flatten",
        },
        Accepted {
            name: "rename",
            kind: Kind::Str,
            value: "the parameter's name as a string",
            example: "rename = \"c_fc.weight\"",
        },
    ],
};

/// What `#[param(..)]` says of a field.
#[derive(Default)]
struct FieldOptions {
    skip: bool,
    flatten: bool,
    rename: Option<LitStr>,
}

pub(crate) fn derive(input: TokenStream) -> TokenStream {
    let input = match syn::parse2::<DeriveInput>(input) {
        Ok(input) => input,
        Err(error) => return error.into_compile_error(),
    };
    generate(&input).unwrap_or_else(|error| {
        // The error, and an impl that lets the rest of the crate type-check, so that one mistake
        // is one error rather than one more at every use of the model.
        let error = error.into_compile_error();
        let fallback = fallback(&input);
        quote!(#error #fallback)
    })
}

/// The struct's options: the crate path (`::tensorscope` unless given) and the element type, if
/// given.
fn container(input: &DeriveInput) -> syn::Result<(Path, Option<Path>)> {
    let mut krate: Path = syn::parse_quote!(::tensorscope);
    let mut element = None;
    for attr in input.attrs.iter().filter(|a| a.path().is_ident("param")) {
        let tokens = attr.meta.require_list()?.tokens.clone();
        let mut errors = Vec::new();
        for found in args::parse(&OPTIONS, tokens, &mut errors) {
            match (found.key.as_str(), found.value) {
                ("crate", Value::Path(path)) => krate = path,
                (_, Value::Path(path)) => element = Some(path),
                _ => unreachable!("both options take a path"),
            }
        }
        args::combine(errors)?;
    }
    Ok((krate, element))
}

/// The element type: `element = ".."` if given, else the struct's type parameter bounded by
/// `Element` (as `struct Linear<T: Element>`), else `f32`.
fn element_type(input: &DeriveInput, given: Option<Path>) -> syn::Result<TokenStream> {
    if let Some(path) = given {
        return Ok(path.into_token_stream());
    }
    let bounded: Vec<_> = input
        .generics
        .params
        .iter()
        .filter_map(|p| match p {
            GenericParam::Type(t) if t.bounds.iter().any(is_element_bound) => Some(&t.ident),
            _ => None,
        })
        .collect();
    match bounded[..] {
        [] => Ok(quote!(f32)),
        [ident] => Ok(ident.into_token_stream()),
        _ => Err(syn::Error::new_spanned(
            &input.generics,
            "derive(Parameters) found several type parameters bounded by `Element`; name the \
             parameters' element type with `#[param(element = \"T\")]`",
        )),
    }
}

fn is_element_bound(bound: &TypeParamBound) -> bool {
    matches!(bound, TypeParamBound::Trait(t)
        if t.path.segments.last().is_some_and(|s| s.ident == "Element"))
}

/// Parses the field's `#[param(..)]` options. Every problem is reported, each at its option: an
/// unknown option (with the closest accepted one), one given twice, an empty name, and a second of
/// the options that exclude each other.
fn field_options(field: &syn::Field) -> syn::Result<FieldOptions> {
    let mut options = FieldOptions::default();
    let mut errors = Vec::new();
    // The options given so far, in order, each once: for repeats and exclusions.
    let mut given: Vec<(String, Span)> = Vec::new();
    for attr in field.attrs.iter().filter(|a| a.path().is_ident("param")) {
        let parser = |meta: ParseNestedMeta<'_>| {
            let path = &meta.path;
            let key = path
                .get_ident()
                .map_or_else(|| quote!(#path).to_string(), ToString::to_string);
            let span = path.span();
            match key.as_str() {
                "skip" => options.skip = true,
                "flatten" => options.flatten = true,
                "rename" => {
                    let value = if meta.input.peek(syn::Token![=]) {
                        Some(meta.value()?.parse::<syn::Expr>()?)
                    } else {
                        None
                    };
                    let Some(syn::Expr::Lit(syn::ExprLit {
                        lit: syn::Lit::Str(name),
                        ..
                    })) = value
                    else {
                        let message = "`rename` expects the parameter's name as a string, as in \
                                       `rename = \"c_fc.weight\"`";
                        errors.push(match value {
                            Some(value) => syn::Error::new_spanned(value, message),
                            None => syn::Error::new(span, message),
                        });
                        return Ok(());
                    };
                    if name.value().split('.').any(str::is_empty) {
                        errors.push(syn::Error::new_spanned(
                            &name,
                            "a parameter name cannot be empty or hold an empty segment \
                             (`a..b`, `.a`, `a.`)",
                        ));
                    }
                    options.rename = Some(name);
                }
                _ => {
                    errors.push(syn::Error::new(
                        span,
                        args::unknown_key(&FIELD_OPTIONS, &key),
                    ));
                    // Past its value, if any, so that the next option still parses.
                    if meta.input.peek(syn::Token![=]) {
                        meta.value()?.parse::<syn::Expr>()?;
                    }
                    return Ok(());
                }
            }
            if given.iter().any(|(k, _)| *k == key) {
                errors.push(syn::Error::new(
                    span,
                    format!("`{key}` is given twice; keep one"),
                ));
            } else {
                given.push((key, span));
            }
            Ok(())
        };
        if let Err(e) = attr.parse_nested_meta(parser) {
            errors.push(e);
        }
    }
    if let [(first, _), (second, span), ..] = &given[..] {
        errors.push(syn::Error::new(
            *span,
            format!(
                "`{second}` cannot go with `{first}`: a field is left out (`skip`), walked under \
                 its parent's path (`flatten`) or walked under a name of its own (`rename`)"
            ),
        ));
    }
    args::combine(errors)?;
    Ok(options)
}

/// A field to walk: how the walk reaches it (`self.name` in a struct, a binding in an enum's
/// variant), its name in the path, its type and its options.
struct Field<'a> {
    access: TokenStream,
    name: String,
    ty: &'a Type,
    options: FieldOptions,
}

/// The fields of a struct or of one variant, their options parsed (each problem pushed to
/// `errors`). A variant's fields are reached through bindings `__field_N`.
fn fields_of<'a>(
    fields: &'a syn::Fields,
    bound: bool,
    errors: &mut Vec<syn::Error>,
) -> Vec<Field<'a>> {
    fields
        .iter()
        .enumerate()
        .filter_map(|(i, f)| {
            let mut options = field_options(f).map_err(|e| errors.push(e)).ok()?;
            let name = f
                .ident
                .as_ref()
                .map_or_else(|| i.to_string(), ToString::to_string);
            // A variant holding one unnamed value (`Res(ResBlock)`) is that value, as a
            // `ModuleList` holds its modules: walked at the enum's path.
            let newtype = bound && f.ident.is_none() && fields.len() == 1;
            if newtype && !options.skip && options.rename.is_none() {
                options.flatten = true;
            }
            let access = match (bound, &f.ident) {
                (true, _) => {
                    syn::Ident::new(&format!("__field_{i}"), Span::call_site()).into_token_stream()
                }
                (false, Some(ident)) => quote!(#ident),
                (false, None) => syn::Index::from(i).into_token_stream(),
            };
            Some(Field {
                access,
                name,
                ty: &f.ty,
                options,
            })
        })
        .collect()
}

fn generate(input: &DeriveInput) -> syn::Result<TokenStream> {
    // Every mistake in the options and all the fields' is reported at once.
    let mut errors = Vec::new();
    let settings = container(input)
        .and_then(|(krate, element)| Ok((krate, element_type(input, element)?)))
        .map_err(|e| errors.push(e))
        .ok();
    // The struct's fields, or each variant's with the pattern that binds them.
    let parts: Vec<(Option<TokenStream>, Vec<Field<'_>>)> = match &input.data {
        Data::Struct(data) => vec![(None, fields_of(&data.fields, false, &mut errors))],
        Data::Enum(data) => data
            .variants
            .iter()
            .map(|v| {
                let ident = &v.ident;
                let fields = fields_of(&v.fields, true, &mut errors);
                // A skipped field is not bound (with errors, the fields may be fewer; the
                // derive then fails before the patterns are used).
                let bindings: Vec<TokenStream> = (0..v.fields.len())
                    .map(|i| match fields.get(i) {
                        Some(f) if !f.options.skip => f.access.clone(),
                        _ => quote!(_),
                    })
                    .collect();
                let pattern = match &v.fields {
                    syn::Fields::Named(named) => {
                        let names = named.named.iter().map(|f| &f.ident);
                        quote!(Self::#ident { #(#names: #bindings),* })
                    }
                    syn::Fields::Unnamed(_) => quote!(Self::#ident(#(#bindings),*)),
                    syn::Fields::Unit => quote!(Self::#ident),
                };
                (Some(pattern), fields)
            })
            .collect(),
        Data::Union(_) => {
            return Err(syn::Error::new_spanned(
                &input.ident,
                "derive(Parameters) supports structs and enums, not unions",
            ))
        }
    };
    args::combine(errors)?;
    let (krate, element) = settings.expect("no error");
    let walk = |method: TokenStream, reference: TokenStream| {
        let arms = parts.iter().map(|(pattern, fields)| {
            let calls = fields.iter().filter(|f| !f.options.skip).map(|f| {
                let path = if f.options.flatten {
                    quote!(__path)
                } else {
                    let name = f
                        .options
                        .rename
                        .as_ref()
                        .map_or_else(|| f.name.clone(), LitStr::value);
                    quote!(&__path.field(#name))
                };
                let (ty, access) = (f.ty, &f.access);
                let value = match pattern {
                    None => quote!(#reference self.#access),
                    Some(_) => quote!(#access),
                };
                // At the field's type, so that a field that is no set of parameters is an error
                // there.
                quote_spanned! {ty.span()=>
                    <#ty as #krate::Parameters<#element>>::#method(#value, #path, __f);
                }
            });
            match pattern {
                None => quote!(#(#calls)*),
                Some(pattern) => quote!(#pattern => { #(#calls)* }),
            }
        });
        match &input.data {
            Data::Enum(data) if data.variants.is_empty() => quote!(match *self {}),
            Data::Enum(_) => quote!(match self { #(#arms)* }),
            _ => quote!(#(#arms)*),
        }
    };
    let visit = walk(quote!(visit_params), quote!(&));
    let visit_mut = walk(quote!(visit_params_mut), quote!(&mut));
    let name = &input.ident;
    // A field whose type holds one of the struct's type parameters (`blocks: Vec<B>`) is a set of
    // parameters where that parameter is: the impl says so, as serde's derives do.
    let mut generics = input.generics.clone();
    let type_params: Vec<&syn::Ident> = input.generics.type_params().map(|t| &t.ident).collect();
    let element_name = element.to_string();
    for f in parts.iter().flat_map(|(_, fields)| fields) {
        let generic = type_params
            .iter()
            .any(|t| **t != element_name && mentions(f.ty, t));
        if generic && !f.options.skip {
            let ty = f.ty;
            generics
                .make_where_clause()
                .predicates
                .push(syn::parse_quote!(#ty: #krate::Parameters<#element>));
        }
    }
    let (impl_generics, ty_generics, where_clause) = generics.split_for_impl();
    Ok(quote! {
        #[automatically_derived]
        impl #impl_generics #krate::Parameters<#element> for #name #ty_generics #where_clause {
            fn visit_params(
                &self,
                __path: &#krate::ParamPath<'_>,
                __f: &mut dyn FnMut(&#krate::ParamPath<'_>, &#krate::Param<#element>),
            ) {
                #visit
            }

            fn visit_params_mut(
                &mut self,
                __path: &#krate::ParamPath<'_>,
                __f: &mut dyn FnMut(&#krate::ParamPath<'_>, &mut #krate::Param<#element>),
            ) {
                #visit_mut
            }
        }
    })
}

/// An impl that type-checks and is never run: the one emitted beside a derive error.
fn fallback(input: &DeriveInput) -> TokenStream {
    let (krate, element) =
        container(input).unwrap_or_else(|_| (syn::parse_quote!(::tensorscope), None));
    let element = element_type(input, element).unwrap_or_else(|_| quote!(f32));
    let name = &input.ident;
    let (impl_generics, ty_generics, where_clause) = input.generics.split_for_impl();
    quote! {
        #[automatically_derived]
        impl #impl_generics #krate::Parameters<#element> for #name #ty_generics #where_clause {
            fn visit_params(
                &self,
                _: &#krate::ParamPath<'_>,
                _: &mut dyn FnMut(&#krate::ParamPath<'_>, &#krate::Param<#element>),
            ) {
                ::core::unimplemented!("derive(Parameters) failed to compile")
            }

            fn visit_params_mut(
                &mut self,
                _: &#krate::ParamPath<'_>,
                _: &mut dyn FnMut(&#krate::ParamPath<'_>, &mut #krate::Param<#element>),
            ) {
                ::core::unimplemented!("derive(Parameters) failed to compile")
            }
        }
    }
}

/// Whether `ty` names the type parameter `param`.
fn mentions(ty: &Type, param: &syn::Ident) -> bool {
    struct Finder<'p>(&'p syn::Ident, bool);
    impl<'ast> syn::visit::Visit<'ast> for Finder<'_> {
        fn visit_ident(&mut self, ident: &'ast syn::Ident) {
            self.1 |= ident == self.0;
        }
    }
    let mut finder = Finder(param, false);
    syn::visit::Visit::visit_type(&mut finder, ty);
    finder.1
}
