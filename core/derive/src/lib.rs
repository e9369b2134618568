//! `#[derive(Tree)]` for Kiln.
//!
//! Implements `kiln::Tree` for named, tuple and unit structs. Every field is a
//! child tree; a field marked `#[tree(static)]` is stored in the structure as
//! a static value (part of the cache key by equality) instead. Generated code
//! names only `::kiln::...` paths.

use proc_macro2::TokenStream;
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{parse_macro_input, parse_quote, Data, DeriveInput, Fields, Index};

/// Derives `kiln::Tree` for a struct. See the crate docs.
#[proc_macro_derive(Tree, attributes(tree))]
pub fn derive_tree(input: proc_macro::TokenStream) -> proc_macro::TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    expand(input)
        .unwrap_or_else(syn::Error::into_compile_error)
        .into()
}

/// One field of the struct, as the generated code sees it.
struct FieldInfo {
    /// The name in the `TreeDef`: the ident, or `0`, `1`, ... for tuple structs.
    name: String,
    /// `self.<member>`.
    member: syn::Member,
    /// Whether it is `#[tree(static)]`.
    is_static: bool,
    /// The field's type.
    ty: syn::Type,
    span: proc_macro2::Span,
}

fn expand(mut input: DeriveInput) -> syn::Result<TokenStream> {
    if let Some(attr) = input.attrs.iter().find(|a| a.path().is_ident("tree")) {
        return Err(syn::Error::new(
            attr.span(),
            "`#[tree(...)]` goes on fields (`#[tree(static)]`), not on the type",
        ));
    }
    let data = match &input.data {
        Data::Struct(data) => data,
        Data::Enum(e) => {
            return Err(syn::Error::new(
                e.enum_token.span(),
                "#[derive(Tree)] supports structs only, not enums: flatten an enum by hand \
                 or make its variants separate structs",
            ))
        }
        Data::Union(u) => {
            return Err(syn::Error::new(
                u.union_token.span(),
                "#[derive(Tree)] supports structs only, not unions",
            ))
        }
    };
    let fields = field_infos(&data.fields)?;

    let type_params: Vec<syn::Ident> = input
        .generics
        .type_params()
        .map(|p| p.ident.clone())
        .collect();
    let where_clause = input.generics.make_where_clause();
    for ident in &type_params {
        where_clause
            .predicates
            .push(parse_quote!(#ident: ::kiln::Tree));
    }
    let name = &input.ident;
    let (impl_generics, ty_generics, where_clause) = input.generics.split_for_impl();

    let support = quote!(::kiln::tree::derive_support);
    let flatten_children = fields.iter().map(|f| {
        let FieldInfo {
            name,
            member,
            is_static,
            span,
            ..
        } = f;
        if *is_static {
            // Floats are statics by their bits; everything else by its own
            // `Eq` and `Hash` (method resolution picks the float impl first).
            // Spanned at the type, so a type that cannot be static is
            // reported on the field's line.
            let span = f.ty.span();
            quote_spanned!(span=> {
                #[allow(unused_imports)]
                use #support::{StaticFloatField as _, StaticValueField as _};
                (&#support::StaticProbe(&self.#member)).static_def(#name)
            })
        } else {
            quote_spanned!(*span=> #support::flatten_field(&self.#member, #name, leaves)?)
        }
    });
    let field_names = fields.iter().map(|f| &f.name);
    let unflatten_children = fields.iter().enumerate().map(|(i, f)| {
        let FieldInfo {
            name,
            is_static,
            span,
            ty,
            ..
        } = f;
        let value = if *is_static {
            let span = ty.span();
            quote_spanned!(span=> {
                #[allow(unused_imports)]
                use #support::{StaticFloatRead as _, StaticValueRead as _};
                (&#support::StaticProbe::<::std::marker::PhantomData<#ty>>::target()).read_static(&fields[#i].1, #name)?
            })
        } else {
            quote_spanned!(*span=> #support::unflatten_field(&fields[#i].1, #name, leaves)?)
        };
        match &f.member {
            syn::Member::Named(ident) => quote!(#ident: #value),
            syn::Member::Unnamed(_) => value,
        }
    });
    let construct = match &data.fields {
        Fields::Named(_) => quote!(Self { #(#unflatten_children),* }),
        Fields::Unnamed(_) => quote!(Self ( #(#unflatten_children),* )),
        Fields::Unit => quote!(Self),
    };
    let leaves_param = if fields.is_empty() {
        quote!(_leaves)
    } else {
        quote!(leaves)
    };
    let fields_binding = if fields.is_empty() {
        quote!(_fields)
    } else {
        quote!(fields)
    };

    // A struct's Jacobian cannot be the struct with other leaves (Rust
    // cannot name that type): one `In` per array leaf, in flatten order.
    let mut jacobian_generics = input.generics.clone();
    jacobian_generics
        .params
        .push(parse_quote!(__KilnJacobianIn: ::kiln::Tree));
    let (jacobian_impl_generics, _, _) = jacobian_generics.split_for_impl();

    Ok(quote! {
        impl #jacobian_impl_generics ::kiln::JacobianOutput<__KilnJacobianIn>
            for #name #ty_generics #where_clause
        {
            type Jacobian = ::std::vec::Vec<__KilnJacobianIn>;

            fn jacobian_from(
                &self,
                per_leaf: &mut ::std::vec::IntoIter<__KilnJacobianIn>,
            ) -> ::kiln::Result<Self::Jacobian> {
                #support::jacobian_per_leaf(self, per_leaf)
            }
        }

        impl #impl_generics ::kiln::Tree for #name #ty_generics #where_clause {
            fn flatten(
                &self,
                #leaves_param: &mut ::std::vec::Vec<::kiln::Array>,
            ) -> ::kiln::Result<::kiln::TreeDef> {
                ::core::result::Result::Ok(#support::node(
                    ::core::any::type_name::<Self>(),
                    ::std::vec![#(#flatten_children),*],
                ))
            }

            fn unflatten(
                def: &::kiln::TreeDef,
                #leaves_param: &mut ::std::vec::IntoIter<::kiln::Array>,
            ) -> ::kiln::Result<Self> {
                let #fields_binding = #support::expect_node(
                    def,
                    ::core::any::type_name::<Self>(),
                    &[#(#field_names),*],
                )?;
                ::core::result::Result::Ok(#construct)
            }
        }
    })
}

fn field_infos(fields: &Fields) -> syn::Result<Vec<FieldInfo>> {
    fields
        .iter()
        .enumerate()
        .map(|(i, field)| {
            let (name, member) = match &field.ident {
                Some(ident) => (ident.to_string(), syn::Member::Named(ident.clone())),
                None => (
                    i.to_string(),
                    syn::Member::Unnamed(Index {
                        index: i as u32,
                        span: field.span(),
                    }),
                ),
            };
            Ok(FieldInfo {
                name,
                member,
                is_static: is_static_field(field)?,
                ty: field.ty.clone(),
                span: field.span(),
            })
        })
        .collect()
}

/// Whether the field carries `#[tree(static)]`; any other `tree` attribute is
/// an error naming it.
fn is_static_field(field: &syn::Field) -> syn::Result<bool> {
    let mut is_static = false;
    for attr in field.attrs.iter().filter(|a| a.path().is_ident("tree")) {
        let syn::Meta::List(list) = &attr.meta else {
            return Err(syn::Error::new(
                attr.span(),
                "malformed attribute `#[tree]`: expected `#[tree(static)]`",
            ));
        };
        attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("static") && meta.input.is_empty() {
                is_static = true;
                Ok(())
            } else {
                Err(meta.error(format!(
                    "unknown or malformed attribute `#[tree({})]`: expected `#[tree(static)]`",
                    list.tokens
                )))
            }
        })?;
    }
    Ok(is_static)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expand_str(src: &str) -> Result<String, String> {
        let input: DeriveInput = syn::parse_str(src).map_err(|e| e.to_string())?;
        expand(input)
            .map(|t| t.to_string())
            .map_err(|e| e.to_string())
    }

    #[test]
    fn enums_are_rejected_with_a_clear_message() {
        let err = expand_str("enum E { A, B }").unwrap_err();
        assert!(err.contains("supports structs only, not enums"), "{err}");
    }

    #[test]
    fn unions_are_rejected() {
        let err = expand_str("union U { a: u32, b: f32 }").unwrap_err();
        assert!(err.contains("not unions"), "{err}");
    }

    #[test]
    fn unknown_tree_attribute_is_named_in_the_error() {
        let err = expand_str("struct S { #[tree(skip)] a: u32 }").unwrap_err();
        assert!(err.contains("#[tree(skip)]"), "{err}");
        assert!(err.contains("expected `#[tree(static)]`"), "{err}");
    }

    #[test]
    fn bare_and_valued_tree_attributes_are_rejected() {
        let err = expand_str("struct S { #[tree] a: u32 }").unwrap_err();
        assert!(err.contains("`#[tree]`"), "{err}");
        let err = expand_str("struct S { #[tree(static = true)] a: u32 }").unwrap_err();
        assert!(err.contains("static = true"), "{err}");
    }

    #[test]
    fn tree_attribute_on_the_type_is_rejected() {
        let err = expand_str("#[tree(static)] struct S { a: u32 }").unwrap_err();
        assert!(err.contains("goes on fields"), "{err}");
    }

    #[test]
    fn generic_params_get_tree_bounds_and_paths_are_absolute() {
        let out = expand_str("struct W<T> { x: T, #[tree(static)] n: usize }").unwrap();
        assert!(out.contains("T : :: kiln :: Tree"), "{out}");
        assert!(out.contains("static_def"), "{out}");
        assert!(!out.contains(" crate ::"), "{out}");
    }
}
