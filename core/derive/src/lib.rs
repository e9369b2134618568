//! `#[derive(Tree)]` for Kiln.
