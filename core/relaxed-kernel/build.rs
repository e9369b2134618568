//! The wasm32 module shares the main module's memory: it imports it
//! instead of defining one.

fn main() {
    if std::env::var("CARGO_CFG_TARGET_ARCH").as_deref() == Ok("wasm32") {
        println!("cargo::rustc-link-arg-cdylib=--import-memory");
    }
}
