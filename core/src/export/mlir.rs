//! Writing StableHLO as MLIR text: tensor types, SSA values, constants and
//! the small compositions every op family's lowering shares (broadcasts,
//! conversions, comparisons, shapes computed at run time for symbolic
//! dims).
//!
//! The text is the pretty form `jax.jit(f).lower(…).as_text()` prints for
//! jax 0.10.2, which is also what XLA's parser reads back.

use crate::data::HostData;
use crate::error::{Error, Result};
use crate::shape::{Atom, Dim, SymExpr, Symbol};
use crate::DType;
use std::collections::BTreeMap;
use std::fmt::Write;

/// The element type StableHLO writes for `dtype`.
pub(crate) fn element_type(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "f32",
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        DType::I32 => "i32",
        DType::U32 => "ui32",
        DType::Bool => "i1",
        DType::U8 => "ui8",
    }
}

/// `tensor<2x?x4xf32>`: known dims as numbers, symbolic ones as `?`.
pub(crate) fn tensor_type(dims: &[Dim], dtype: DType) -> String {
    let mut text = String::from("tensor<");
    for d in dims {
        match d.known() {
            Some(n) => write!(text, "{n}x").unwrap_or(()),
            None => text.push_str("?x"),
        }
    }
    text.push_str(element_type(dtype));
    text.push('>');
    text
}

/// The comparison type `stablehlo.compare` needs for `dtype`.
pub(crate) fn compare_type(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 | DType::F16 | DType::BF16 => "FLOAT",
        DType::I32 => "SIGNED",
        DType::U32 | DType::U8 | DType::Bool => "UNSIGNED",
    }
}

/// One SSA value of the module being written: its name and type.
#[derive(Clone, Debug)]
pub(crate) struct Value {
    /// `%v12` (or `%arg0`).
    pub name: String,
    /// Its dims (symbolic in a shapeless export).
    pub dims: Vec<Dim>,
    /// Its element type.
    pub dtype: DType,
}

impl Value {
    /// The scalar `name` of `dtype`: an argument of a region's block (a
    /// reducer's, a comparator's).
    pub fn block_scalar(name: String, dtype: DType) -> Value {
        Value {
            name,
            dims: vec![],
            dtype,
        }
    }

    /// Its tensor type.
    pub fn ty(&self) -> String {
        tensor_type(&self.dims, self.dtype)
    }

    /// Its number of dims.
    fn rank(&self) -> usize {
        self.dims.len()
    }
}

/// Where each symbol's size is read at run time: axis `axis` of a main
/// argument.
pub(crate) type SymbolArgs = BTreeMap<Symbol, (Value, usize)>;

/// Writes the ops of one function body (regions nest inside it), naming
/// values from a counter shared by the whole module.
pub(crate) struct Emitter<'a> {
    text: String,
    indent: usize,
    counter: &'a mut usize,
    symbols: &'a SymbolArgs,
}

impl<'a> Emitter<'a> {
    /// An emitter writing at `indent` levels.
    pub fn new(counter: &'a mut usize, symbols: &'a SymbolArgs, indent: usize) -> Emitter<'a> {
        Emitter {
            text: String::new(),
            indent,
            counter,
            symbols,
        }
    }

    /// The text written so far.
    pub fn finish(self) -> String {
        self.text
    }

    /// A fresh SSA name.
    pub fn fresh(&mut self) -> String {
        *self.counter += 1;
        format!("%v{}", self.counter)
    }

    /// Writes one line as is.
    pub fn line(&mut self, line: &str) {
        for _ in 0..self.indent {
            self.text.push_str("  ");
        }
        self.text.push_str(line);
        self.text.push('\n');
    }

    /// Writes `%vN = {rhs}` and returns the value of `dims` and `dtype`.
    pub fn op(&mut self, rhs: &str, dims: &[Dim], dtype: DType) -> Value {
        let name = self.fresh();
        self.line(&format!("{name} = {rhs}"));
        Value {
            name,
            dims: dims.to_vec(),
            dtype,
        }
    }

    /// Runs `body` one indent level deeper (a region's ops).
    pub fn nested<T>(&mut self, body: impl FnOnce(&mut Emitter<'_>) -> T) -> T {
        self.indent += 1;
        let out = body(self);
        self.indent -= 1;
        out
    }

    /// A scalar constant of `dtype` holding `value` (converted as Kiln's
    /// casts convert).
    pub fn scalar(&mut self, value: f64, dtype: DType) -> Value {
        let data = HostData::from_f64s(dtype, std::iter::once(value));
        let literal = element_literal(&data, 0);
        let ty = tensor_type(&[], dtype);
        self.op(
            &format!("stablehlo.constant dense<{literal}> : {ty}"),
            &[],
            dtype,
        )
    }

    /// `value` broadcast (NumPy alignment: trailing dims match) to `dims`,
    /// or `value` itself when its dims are already those.
    pub fn broadcast(&mut self, value: &Value, dims: &[Dim]) -> Result<Value> {
        if value.dims == dims {
            return Ok(value.clone());
        }
        let offset = dims.len() - value.rank();
        let mapping: Vec<usize> = (offset..dims.len()).collect();
        self.broadcast_in_dim(value, dims, &mapping)
    }

    /// `stablehlo.broadcast_in_dim` (or its dynamic form when `dims` has
    /// symbolic sizes) with operand dim `i` at result dim `mapping[i]`.
    pub fn broadcast_in_dim(
        &mut self,
        value: &Value,
        dims: &[Dim],
        mapping: &[usize],
    ) -> Result<Value> {
        let ty = tensor_type(dims, value.dtype);
        let list = join(mapping);
        if dims.iter().all(|d| d.known().is_some()) {
            let rhs = format!(
                "stablehlo.broadcast_in_dim {}, dims = [{list}] : ({}) -> {ty}",
                value.name,
                value.ty()
            );
            return Ok(self.op(&rhs, dims, value.dtype));
        }
        let shape = self.shape_tensor(dims)?;
        let rhs = format!(
            "stablehlo.dynamic_broadcast_in_dim {}, {}, dims = [{list}] : ({}, {}) -> {ty}",
            value.name,
            shape.name,
            value.ty(),
            shape.ty()
        );
        Ok(self.op(&rhs, dims, value.dtype))
    }

    /// `value` reshaped to `dims` (the dynamic form for symbolic dims).
    pub fn reshape(&mut self, value: &Value, dims: &[Dim]) -> Result<Value> {
        if value.dims == dims {
            return Ok(value.clone());
        }
        let ty = tensor_type(dims, value.dtype);
        if dims.iter().all(|d| d.known().is_some()) {
            let rhs = format!(
                "stablehlo.reshape {} : ({}) -> {ty}",
                value.name,
                value.ty()
            );
            return Ok(self.op(&rhs, dims, value.dtype));
        }
        let shape = self.shape_tensor(dims)?;
        let rhs = format!(
            "stablehlo.dynamic_reshape {}, {} : ({}, {}) -> {ty}",
            value.name,
            shape.name,
            value.ty(),
            shape.ty()
        );
        Ok(self.op(&rhs, dims, value.dtype))
    }

    /// `stablehlo.convert` of `value` to `dtype` (no op when equal). This
    /// is StableHLO's conversion, not Kiln's cast: callers use it where
    /// both agree (see `lower::cast` for where they differ).
    pub fn convert(&mut self, value: &Value, dtype: DType) -> Value {
        if value.dtype == dtype {
            return value.clone();
        }
        let ty = tensor_type(&value.dims, dtype);
        let rhs = format!(
            "stablehlo.convert {} : ({}) -> {ty}",
            value.name,
            value.ty()
        );
        self.op(&rhs, &value.dims, dtype)
    }

    /// An elementwise op of two operands of one type (`stablehlo.add`).
    pub fn binary(&mut self, op: &str, a: &Value, b: &Value) -> Value {
        let rhs = format!("stablehlo.{op} {}, {} : {}", a.name, b.name, a.ty());
        self.op(&rhs, &a.dims, a.dtype)
    }

    /// An elementwise op of one operand (`stablehlo.exponential`).
    pub fn unary(&mut self, op: &str, a: &Value) -> Value {
        let rhs = format!("stablehlo.{op} {} : {}", a.name, a.ty());
        self.op(&rhs, &a.dims, a.dtype)
    }

    /// `a <direction> b` as a bool tensor (`direction` is `EQ`, `LT`, …).
    pub fn compare(&mut self, direction: &str, a: &Value, b: &Value) -> Value {
        let out = tensor_type(&a.dims, DType::Bool);
        let rhs = format!(
            "stablehlo.compare {direction}, {}, {}, {} : ({}, {}) -> {out}",
            a.name,
            b.name,
            compare_type(a.dtype),
            a.ty(),
            b.ty()
        );
        self.op(&rhs, &a.dims, DType::Bool)
    }

    /// `a <direction> c` for a scalar constant `c` broadcast to `a`.
    pub fn compare_scalar(&mut self, direction: &str, a: &Value, c: f64) -> Result<Value> {
        let c = self.scalar(c, a.dtype);
        let c = self.broadcast(&c, &a.dims)?;
        Ok(self.compare(direction, a, &c))
    }

    /// `cond ? a : b` elementwise (all three of one shape).
    pub fn select(&mut self, cond: &Value, a: &Value, b: &Value) -> Value {
        let rhs = format!(
            "stablehlo.select {}, {}, {} : {}, {}",
            cond.name,
            a.name,
            b.name,
            cond.ty(),
            a.ty()
        );
        self.op(&rhs, &a.dims, a.dtype)
    }

    /// A constant of `value`'s shape and dtype holding `c` everywhere.
    pub fn splat_like(&mut self, c: f64, like: &Value) -> Result<Value> {
        let s = self.scalar(c, like.dtype);
        self.broadcast(&s, &like.dims)
    }

    /// The constant array `data` of `dims` (raw little-endian bytes as a
    /// hex literal; bool through bytes and a comparison, as MLIR's hex form
    /// of `i1` is one bit per element).
    pub fn constant(&mut self, data: &HostData, dims: &[Dim]) -> Result<Value> {
        let dtype = data.dtype();
        if data.len() == 1 {
            let literal = element_literal(data, 0);
            let ty = tensor_type(dims, dtype);
            return Ok(self.op(
                &format!("stablehlo.constant dense<{literal}> : {ty}"),
                dims,
                dtype,
            ));
        }
        if let HostData::Bool(values) = data {
            let bytes = HostData::U8(values.iter().map(|&b| u8::from(b)).collect());
            let as_bytes = self.constant(&bytes, dims)?;
            return self.compare_scalar("NE", &as_bytes, 0.0);
        }
        let hex = hex_bytes(data);
        let ty = tensor_type(dims, dtype);
        Ok(self.op(
            &format!("stablehlo.constant dense<\"0x{hex}\"> : {ty}"),
            dims,
            dtype,
        ))
    }

    /// The size of `dim` as an `i32` scalar: a constant, or computed from
    /// the arguments' sizes for a symbolic dim.
    pub fn dim_value(&mut self, dim: &Dim) -> Result<Value> {
        match dim {
            Dim::Known(n) => Ok(self.scalar(*n as f64, DType::I32)),
            Dim::Sym(expr) => self.expr_value(expr),
        }
    }

    fn expr_value(&mut self, expr: &SymExpr) -> Result<Value> {
        let mut total: Option<Value> = None;
        for (monomial, coefficient) in expr.terms() {
            let mut term = self.scalar(coefficient as f64, DType::I32);
            for atom in monomial {
                let factor = match atom {
                    Atom::Sym(s) => self.symbol_value(*s)?,
                    Atom::FloorDiv(inner, divisor) => {
                        // Sizes are never negative: truncation is the floor.
                        let inner = self.expr_value(inner)?;
                        let d = self.scalar(*divisor as f64, DType::I32);
                        self.binary("divide", &inner, &d)
                    }
                };
                term = self.binary("multiply", &term, &factor);
            }
            total = Some(match total {
                Some(t) => self.binary("add", &t, &term),
                None => term,
            });
        }
        Ok(match total {
            Some(t) => t,
            None => self.scalar(0.0, DType::I32),
        })
    }

    fn symbol_value(&mut self, s: Symbol) -> Result<Value> {
        let (arg, axis) = self.symbols.get(&s).cloned().ok_or_else(|| {
            unsupported(format!(
                "symbol {s} is no argument's dim, so its size cannot be read at run time"
            ))
        })?;
        let rhs = format!(
            "stablehlo.get_dimension_size {}, dim = {axis} : ({}) -> tensor<i32>",
            arg.name,
            arg.ty()
        );
        Ok(self.op(&rhs, &[], DType::I32))
    }

    /// `dims` as a `tensor<Nxi32>` (the shape operand of the dynamic ops).
    pub fn shape_tensor(&mut self, dims: &[Dim]) -> Result<Value> {
        let mut sizes = Vec::with_capacity(dims.len());
        for d in dims {
            sizes.push(self.dim_value(d)?);
        }
        self.vector(&sizes)
    }

    /// `i32` scalars as one `tensor<Nxi32>`.
    pub fn vector(&mut self, scalars: &[Value]) -> Result<Value> {
        let one = [Dim::Known(1)];
        let mut parts = Vec::with_capacity(scalars.len());
        for v in scalars {
            parts.push(self.reshape(v, &one)?);
        }
        let n = [Dim::Known(scalars.len())];
        if parts.is_empty() {
            return self.constant(&HostData::I32(Vec::new()), &n);
        }
        if parts.len() == 1 {
            return Ok(parts.remove(0));
        }
        let names: Vec<&str> = parts.iter().map(|p| p.name.as_str()).collect();
        let types: Vec<String> = parts.iter().map(Value::ty).collect();
        let rhs = format!(
            "stablehlo.concatenate {}, dim = 0 : ({}) -> {}",
            names.join(", "),
            types.join(", "),
            tensor_type(&n, DType::I32)
        );
        Ok(self.op(&rhs, &n, DType::I32))
    }
}

/// Element `i` of `data` as an MLIR literal: floats by their bits (exact,
/// NaN and infinities included), integers in decimal, bools as words.
fn element_literal(data: &HostData, i: usize) -> String {
    match data {
        HostData::F32(v) => format!("0x{:08X}", v[i].to_bits()),
        HostData::F16(v) => format!("0x{:04X}", v[i].to_bits()),
        HostData::BF16(v) => format!("0x{:04X}", v[i].to_bits()),
        HostData::I32(v) => v[i].to_string(),
        HostData::U32(v) => v[i].to_string(),
        HostData::U8(v) => v[i].to_string(),
        HostData::Bool(v) => v[i].to_string(),
    }
}

/// The elements' little-endian bytes in upper-case hex.
fn hex_bytes(data: &HostData) -> String {
    let mut bytes: Vec<u8> = Vec::with_capacity(data.len() * data.dtype().size_bytes());
    match data {
        HostData::F32(v) => v.iter().for_each(|x| bytes.extend(x.to_le_bytes())),
        HostData::F16(v) => v.iter().for_each(|x| bytes.extend(x.to_le_bytes())),
        HostData::BF16(v) => v.iter().for_each(|x| bytes.extend(x.to_le_bytes())),
        HostData::I32(v) => v.iter().for_each(|x| bytes.extend(x.to_le_bytes())),
        HostData::U32(v) => v.iter().for_each(|x| bytes.extend(x.to_le_bytes())),
        HostData::U8(v) => bytes.extend(v),
        HostData::Bool(v) => bytes.extend(v.iter().map(|&b| u8::from(b))),
    }
    let mut hex = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        write!(hex, "{b:02X}").unwrap_or(());
    }
    hex
}

/// `[1, 2, 3]`'s inside: `1, 2, 3`.
pub(crate) fn join(items: &[usize]) -> String {
    items
        .iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The error of something that has no StableHLO form (yet), naming it.
pub(crate) fn unsupported(detail: impl Into<String>) -> Error {
    Error::InvalidArgument {
        op: "export".into(),
        detail: detail.into(),
        at: None,
    }
}
