//! Between Rhai's values and Kiln's: script values become
//! [`kiln::Value`] trees at the `compile` boundary, and results come back.

use super::nodes::ScriptObject;
use super::script_message;
use crate::format::numpy_dtype;
use kiln::{Array, DType, Value};
use rhai::{Dynamic, EvalAltResult, ImmutableString, Position, FLOAT, INT};
use std::collections::BTreeMap;

/// A Rhai error result, as every binding returns it.
pub type ScriptResult<T> = Result<T, Box<EvalAltResult>>;

/// A runtime error with `message`; Rhai fills in the position of the call
/// that raised it.
pub fn runtime_error(message: impl Into<String>) -> Box<EvalAltResult> {
    EvalAltResult::ErrorRuntime(Dynamic::from(message.into()), Position::NONE).into()
}

/// Turns a Kiln result into a script error naming the failed operation.
pub fn kiln_result<T>(what: &str, result: kiln::Result<T>) -> ScriptResult<T> {
    result.map_err(|e| runtime_error(format!("{what}: {}", script_message(&e))))
}

/// `array` itself, or the error it carries (Kiln builds failed arrays
/// lazily; a script wants the error at the line that made it).
pub fn checked(array: Array) -> ScriptResult<Array> {
    match array.error() {
        Some(e) => Err(runtime_error(script_message(e))),
        None => Ok(array),
    }
}

/// The dtype named `name`: Kiln's name (`f32`, `i32`, ...) or the NumPy
/// name arrays print with (`float32`, `int32`, ...).
pub fn parse_dtype(name: &str) -> ScriptResult<DType> {
    DType::ALL
        .into_iter()
        .find(|&d| d.name() == name || numpy_dtype(d) == name)
        .ok_or_else(|| {
            let known: Vec<String> = DType::ALL
                .iter()
                .map(|&d| match numpy_dtype(d) {
                    numpy if numpy == d.name() => numpy.to_string(),
                    numpy => format!("{} ({numpy})", d.name()),
                })
                .collect();
            runtime_error(format!(
                "unknown dtype \"{name}\"; known: {}",
                known.join(", ")
            ))
        })
}

/// A script value as a Kiln tree value. Functions and other handles become
/// [`Value::Opaque`], which Kiln rejects with a message naming the path.
pub fn to_value(value: &Dynamic) -> Value {
    // A shared value borrowed by the running call (a closure capturing the
    // handle it is called through) cannot be read, not even its type.
    if value.is_locked() {
        return Value::Opaque {
            type_name: "value in use".to_string(),
        };
    }
    if value.is_unit() {
        return Value::None;
    }
    if let Some(a) = value.read_lock::<Array>() {
        return Value::Array(a.clone());
    }
    if let Ok(b) = value.as_bool() {
        return Value::Bool(b);
    }
    if let Ok(i) = value.as_int() {
        return Value::Int(i);
    }
    if let Ok(x) = value.as_float() {
        return Value::Float(x);
    }
    if let Some(s) = value.read_lock::<ImmutableString>() {
        return Value::Str(s.to_string());
    }
    if let Some(items) = value.read_lock::<rhai::Array>() {
        return Value::List(items.iter().map(to_value).collect());
    }
    if let Some(map) = value.read_lock::<rhai::Map>() {
        return Value::Map(map_to_values(&map));
    }
    if let Some(object) = value.read_lock::<ScriptObject>() {
        return Value::Object {
            class: object.class.clone(),
            inner: Box::new(Value::Map(map_to_values(&object.fields))),
        };
    }
    Value::Opaque {
        type_name: value.type_name().to_string(),
    }
}

/// Like [`to_value`], but takes the script value over: once it is dropped
/// the result holds the only references to its arrays, so a donated
/// temporary can be written in place.
pub fn into_value(value: Dynamic) -> Value {
    to_value(&value)
}

/// A script map's entries as Kiln values.
pub fn map_to_values(map: &rhai::Map) -> BTreeMap<String, Value> {
    map.iter()
        .map(|(k, v)| (k.to_string(), to_value(v)))
        .collect()
}

/// A Kiln tree value back as a script value. (`Value` drops its nesting
/// iteratively, so payloads are taken out rather than moved out.)
pub fn from_value(mut value: Value) -> Dynamic {
    use std::mem::take;
    match &mut value {
        Value::None => Dynamic::UNIT,
        Value::Bool(b) => Dynamic::from_bool(*b),
        Value::Int(i) => Dynamic::from_int(*i as INT),
        Value::Float(x) => Dynamic::from_float(*x as FLOAT),
        Value::Str(s) => Dynamic::from(take(s)),
        Value::Array(a) => Dynamic::from(a.clone()),
        Value::List(items) | Value::Tuple(items) => {
            Dynamic::from_array(take(items).into_iter().map(from_value).collect())
        }
        Value::Map(map) => Dynamic::from_map(values_to_map(take(map))),
        Value::Object { class, inner } => match &mut **inner {
            Value::Map(fields) => Dynamic::from(ScriptObject {
                class: class.clone(),
                fields: values_to_map(take(fields)),
            }),
            other => Dynamic::from(ScriptObject {
                class: class.clone(),
                fields: rhai::Map::from([("value".into(), from_value(take(other)))]),
            }),
        },
        Value::Opaque { type_name } => Dynamic::from(format!("<{type_name}>")),
    }
}

fn values_to_map(map: BTreeMap<String, Value>) -> rhai::Map {
    map.into_iter()
        .map(|(k, v)| (k.into(), from_value(v)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn script_containers_become_kiln_trees_and_back() {
        let x = Array::from_vec(vec![1.0f32, 2.0], &[2]).unwrap();
        let mut map = rhai::Map::new();
        map.insert("x".into(), Dynamic::from(x));
        map.insert("n".into(), Dynamic::from_int(3));
        let list = Dynamic::from_array(vec![Dynamic::from_map(map), Dynamic::from_float(0.5)]);
        let value = to_value(&list);
        let Value::List(items) = &value else {
            panic!("{value:?}")
        };
        assert!(matches!(&items[1], Value::Float(f) if *f == 0.5));
        let Value::Map(m) = &items[0] else {
            panic!("{value:?}")
        };
        assert!(matches!(m.get("n"), Some(Value::Int(3))));
        let back = from_value(value);
        let items = back.into_array().unwrap();
        let map = items[0].clone().cast::<rhai::Map>();
        let x = map["x"].clone().cast::<Array>();
        assert_eq!(x.to_vec::<f32>().unwrap(), vec![1.0, 2.0]);
    }

    #[test]
    fn a_function_pointer_is_opaque() {
        let f = Dynamic::from(rhai::FnPtr::new("f").unwrap());
        assert!(matches!(to_value(&f), Value::Opaque { .. }));
    }

    #[test]
    fn unknown_dtypes_list_the_known_ones() {
        let err = parse_dtype("f64").unwrap_err().to_string();
        assert!(
            err.contains("unknown dtype \"f64\"; known: f32 (float32), f16 (float16)"),
            "{err}"
        );
    }

    #[test]
    fn numpy_dtype_names_are_accepted_beside_kiln_ones() {
        for (alias, kiln) in [
            ("float32", "f32"),
            ("float16", "f16"),
            ("bfloat16", "bf16"),
            ("int32", "i32"),
            ("uint32", "u32"),
            ("uint8", "u8"),
            ("bool", "bool"),
        ] {
            assert_eq!(parse_dtype(alias).unwrap(), parse_dtype(kiln).unwrap());
        }
    }

    #[test]
    fn every_printed_dtype_name_parses_back() {
        for d in DType::ALL {
            assert_eq!(parse_dtype(numpy_dtype(d)).unwrap(), d);
        }
    }
}
