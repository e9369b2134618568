//! Quantized weights in scripts: `quantize_nf4(w)`, `quantize_int8(w)` and
//! `quantize_affine(w, bits, group)` make objects of the node classes
//! `nf4`, `int8` and `affine_quantized` (codes and scales as children, the
//! format as aux data), so they pass through `compile` as trees. `x @ q`
//! applies Kiln's implicit array: the lowering pass picks the quantized
//! matmul handler, and the report shows it; `implicit(q)` is the implicit
//! array itself, which an op without a handler materializes (the report
//! names the op).

use super::nodes::{register_node, NodeSpec, ScriptObject};
use super::values::{checked, runtime_error, ScriptResult};
use kiln::implicit::{AffineQuantized, Int8, Nf4};
use kiln::{Array, ImplicitArray, QuantFormat};
use rhai::{Dynamic, Engine, Map, INT};
use std::sync::Arc;

/// The three classes with their children and aux fields.
const CLASSES: [&str; 3] = ["nf4", "int8", "affine_quantized"];

fn register_classes() -> ScriptResult<()> {
    for class in CLASSES {
        let spec = NodeSpec {
            children: vec!["packed".into(), "scales".into(), "biases".into()],
            aux: vec!["bits".into(), "group_size".into()],
        };
        register_node(class, spec).map_err(runtime_error)?;
    }
    Ok(())
}

/// The script object of a quantized weight.
fn object(
    class: &str,
    packed: Array,
    scales: Array,
    biases: Option<Array>,
    format: QuantFormat,
) -> ScriptObject {
    let mut fields = Map::new();
    fields.insert("packed".into(), Dynamic::from(packed));
    fields.insert("scales".into(), Dynamic::from(scales));
    fields.insert("biases".into(), biases.map_or(Dynamic::UNIT, Dynamic::from));
    fields.insert("bits".into(), Dynamic::from(format.bits() as INT));
    fields.insert(
        "group_size".into(),
        Dynamic::from(format.group_size().unwrap_or(0) as INT),
    );
    ScriptObject {
        class: Arc::from(class),
        fields,
    }
}

fn field_array(object: &ScriptObject, name: &str) -> ScriptResult<Array> {
    object
        .fields
        .get(name)
        .and_then(|v| v.clone().try_cast::<Array>())
        .ok_or_else(|| {
            runtime_error(format!(
                "a `{}` object needs an array `{name}`",
                object.class
            ))
        })
}

fn field_int(object: &ScriptObject, name: &str) -> ScriptResult<usize> {
    object
        .fields
        .get(name)
        .and_then(|v| v.as_int().ok())
        .and_then(|n| usize::try_from(n).ok())
        .ok_or_else(|| {
            runtime_error(format!(
                "a `{}` object needs a number `{name}`",
                object.class
            ))
        })
}

/// The implicit array a script object stands for.
fn implicit(object: &ScriptObject) -> ScriptResult<Array> {
    let packed = field_array(object, "packed")?;
    let scales = field_array(object, "scales")?;
    let biases = object
        .fields
        .get("biases")
        .and_then(|v| v.clone().try_cast::<Array>());
    let array = match &*object.class {
        "nf4" => Nf4 {
            packed,
            scales,
            biases,
            format: QuantFormat::Nf4,
        }
        .array(),
        "int8" => Int8 {
            packed,
            scales,
            biases,
            format: QuantFormat::Int8,
        }
        .array(),
        "affine_quantized" => AffineQuantized {
            packed,
            scales,
            biases,
            format: QuantFormat::affine(
                field_int(object, "bits")? as u32,
                field_int(object, "group_size")?,
            ),
        }
        .array(),
        other => {
            return Err(runtime_error(format!(
                "`{other}` objects are not quantized weights (nf4, int8, affine_quantized)"
            )))
        }
    };
    checked(array)
}

/// The bytes of an array's elements (known shapes).
fn bytes_of(a: &Array) -> INT {
    a.nbytes().unwrap_or(0) as INT
}

/// Registers the quantization functions and the `@` of quantized weights.
pub(super) fn register(engine: &mut Engine) {
    engine
        .register_fn("quantize_nf4", |w: Array| {
            register_classes()?;
            let q = Nf4::quantize(&checked(w)?);
            let (packed, scales) = (checked(q.packed)?, checked(q.scales)?);
            Ok::<_, Box<rhai::EvalAltResult>>(object("nf4", packed, scales, None, q.format))
        })
        .register_fn("quantize_int8", |w: Array| {
            register_classes()?;
            let q = Int8::quantize(&checked(w)?);
            let (packed, scales) = (checked(q.packed)?, checked(q.scales)?);
            Ok::<_, Box<rhai::EvalAltResult>>(object("int8", packed, scales, None, q.format))
        })
        .register_fn("quantize_affine", |w: Array, bits: INT, group: INT| {
            register_classes()?;
            let bits = u32::try_from(bits).map_err(|_| runtime_error(format!("bits {bits}")))?;
            let group =
                usize::try_from(group).map_err(|_| runtime_error(format!("group {group}")))?;
            let q = AffineQuantized::quantize(&checked(w)?, bits, group);
            let biases = q.biases.map(checked).transpose()?;
            let (packed, scales) = (checked(q.packed)?, checked(q.scales)?);
            Ok::<_, Box<rhai::EvalAltResult>>(object(
                "affine_quantized",
                packed,
                scales,
                biases,
                q.format,
            ))
        })
        .register_fn("@", |x: &mut Array, w: ScriptObject| {
            checked(x.matmul(&implicit(&w)?))
        })
        .register_fn("matmul", |x: &mut Array, w: ScriptObject| {
            checked(x.matmul(&implicit(&w)?))
        })
        .register_fn("implicit", |w: ScriptObject| implicit(&w))
        .register_fn("nbytes", |a: &mut Array| bytes_of(a))
        .register_fn("nbytes", |w: ScriptObject| {
            ["packed", "scales", "biases"]
                .iter()
                .filter_map(|f| w.fields.get(*f).and_then(|v| v.clone().try_cast::<Array>()))
                .map(|a| bytes_of(&a))
                .sum::<INT>()
        });
}
