//! The relaxed-SIMD kernel module (`core/relaxed-kernel`): built for
//! wasm32 beside the playground's module, and checked to be safe to
//! instantiate on that module's memory.

use crate::cross::{self as wasm, Route};
use std::fs;
use std::path::PathBuf;
use wasmparser::{Operator, Parser, Payload, TypeRef};

/// The name the site serves it under (`web/static/index.html` fetches it).
pub const SERVED: &str = "kiln_relaxed_kernel.wasm";

/// The functions the module exports (Kiln's `RelaxedKernels`).
const EXPORTS: [&str; 2] = ["block_product", "affine_codes_dot"];

/// Builds the module with the cargo `profile` and checks it
/// ([`check_shares_memory_safely`]); returns its path.
pub fn build(profile: &str) -> Result<PathBuf, String> {
    let root = wasm::cargo_build(
        Route::Auto,
        &["-p", "kiln-relaxed-kernel", "--profile", profile],
    )?;
    let module = wasm::artifacts(&root, profile).join("kiln_relaxed_kernel.wasm");
    let bytes = fs::read(&module).map_err(|e| format!("cannot read {}: {e}", module.display()))?;
    check_shares_memory_safely(&bytes).map_err(|e| format!("{}: {e}", module.display()))?;
    Ok(module)
}

/// Whether a module may be instantiated on another module's memory and
/// called with its addresses: it imports its one memory (`env.memory`)
/// and defines none, has no data segment (instantiation would write it
/// into that memory), reads or writes no global (the shadow-stack pointer,
/// whose stack would lie in that memory too) and exports [`EXPORTS`].
pub fn check_shares_memory_safely(bytes: &[u8]) -> Result<(), String> {
    let mut imports_memory = false;
    let mut exported = [false; EXPORTS.len()];
    for payload in Parser::new(0).parse_all(bytes) {
        match payload.map_err(|e| format!("unreadable module: {e}"))? {
            Payload::ImportSection(imports) => {
                for import in imports.into_imports() {
                    let import = import.map_err(|e| format!("unreadable import: {e}"))?;
                    if let TypeRef::Memory(_) = import.ty {
                        if (import.module, import.name) != ("env", "memory") {
                            return Err(format!(
                                "it imports memory as {}.{}, not env.memory",
                                import.module, import.name
                            ));
                        }
                        imports_memory = true;
                    }
                }
            }
            Payload::MemorySection(memories) if memories.count() > 0 => {
                return Err("it defines a memory of its own".to_string());
            }
            Payload::DataSection(data) if data.count() > 0 => {
                return Err(format!(
                    "it has {} data segment(s), which would be written into the shared memory",
                    data.count()
                ));
            }
            Payload::ExportSection(exports) => {
                for export in exports {
                    let export = export.map_err(|e| format!("unreadable export: {e}"))?;
                    for (found, name) in exported.iter_mut().zip(EXPORTS) {
                        *found |= export.name == name;
                    }
                }
            }
            Payload::CodeSectionEntry(body) => {
                let mut operators = body
                    .get_operators_reader()
                    .map_err(|e| format!("unreadable code: {e}"))?;
                while !operators.eof() {
                    match operators
                        .read()
                        .map_err(|e| format!("unreadable code: {e}"))?
                    {
                        Operator::GlobalGet { global_index }
                        | Operator::GlobalSet { global_index } => {
                            return Err(format!(
                                "its code uses global {global_index} (a shadow stack in the shared memory)"
                            ));
                        }
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    if !imports_memory {
        return Err("it does not import env.memory".to_string());
    }
    match EXPORTS.iter().zip(exported).find(|&(_, found)| !found) {
        Some((name, _)) => Err(format!("it does not export {name}")),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasm_encoder::{
        CodeSection, ConstExpr, DataSection, EntityType, ExportKind, ExportSection, Function,
        FunctionSection, GlobalSection, GlobalType, ImportSection, Instruction, MemorySection,
        MemoryType, Module, TypeSection, ValType,
    };

    /// What a test module holds besides one function, exported under
    /// every name of [`EXPORTS`] but those `missing`.
    #[derive(Default)]
    struct Parts {
        own_memory: bool,
        data: bool,
        global_get: bool,
        missing: &'static [&'static str],
    }

    fn module(parts: Parts) -> Vec<u8> {
        let memory = MemoryType {
            minimum: 1,
            maximum: None,
            memory64: false,
            shared: false,
            page_size_log2: None,
        };
        let mut module = Module::new();
        let mut types = TypeSection::new();
        types.ty().function([], []);
        module.section(&types);
        if !parts.own_memory {
            let mut imports = ImportSection::new();
            imports.import("env", "memory", EntityType::Memory(memory));
            module.section(&imports);
        }
        let mut functions = FunctionSection::new();
        functions.function(0);
        module.section(&functions);
        if parts.own_memory {
            let mut memories = MemorySection::new();
            memories.memory(memory);
            module.section(&memories);
        }
        let mut globals = GlobalSection::new();
        let global = GlobalType {
            val_type: ValType::I32,
            mutable: true,
            shared: false,
        };
        globals.global(global, &ConstExpr::i32_const(1 << 20));
        module.section(&globals);
        let mut exports = ExportSection::new();
        for name in EXPORTS.iter().filter(|name| !parts.missing.contains(name)) {
            exports.export(name, ExportKind::Func, 0);
        }
        module.section(&exports);
        let mut code = CodeSection::new();
        let mut body = Function::new([]);
        if parts.global_get {
            body.instruction(&Instruction::GlobalGet(0));
            body.instruction(&Instruction::Drop);
        }
        body.instruction(&Instruction::End);
        code.function(&body);
        module.section(&code);
        if parts.data {
            let mut data = DataSection::new();
            data.active(0, &ConstExpr::i32_const(16), *b"kiln");
            module.section(&data);
        }
        module.finish()
    }

    #[test]
    fn a_module_on_the_imported_memory_alone_shares_it_safely() {
        assert_eq!(
            check_shares_memory_safely(&module(Parts::default())),
            Ok(())
        );
    }

    #[test]
    fn data_a_shadow_stack_a_memory_of_its_own_or_a_missing_export_is_refused() {
        let refusal = |parts| check_shares_memory_safely(&module(parts)).unwrap_err();
        assert!(refusal(Parts {
            data: true,
            ..Parts::default()
        })
        .contains("data segment"));
        assert!(refusal(Parts {
            global_get: true,
            ..Parts::default()
        })
        .contains("global 0"));
        assert!(refusal(Parts {
            own_memory: true,
            ..Parts::default()
        })
        .contains("memory of its own"));
        assert_eq!(
            refusal(Parts {
                missing: &["affine_codes_dot"],
                ..Parts::default()
            }),
            "it does not export affine_codes_dot"
        );
    }
}
