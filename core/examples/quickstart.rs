//! Kiln in one page: lazy arrays, a compiled function over a struct, and
//! what the compile cache saw.

use kiln::{compile, nn, Array, DType, Tree};

/// Parameters of one dense layer.
#[derive(Tree, Clone)]
struct Dense {
    w: Array,
    b: Array,
}

fn main() -> kiln::Result<()> {
    // Eager: ops build a lazy graph; reading a value runs it.
    let x = Array::arange(0.0, 6.0, 1.0, DType::F32)?.reshape(&[2, 3]);
    let y = nn::softmax(&x, -1);
    println!("softmax rows: {:?}", y.to_vec::<f32>()?);

    // Compiled: traced once per argument signature, then served from the cache.
    let layer = compile(|(p, x): (Dense, Array)| nn::gelu(&(x.matmul(&p.w) + &p.b)));
    let params = Dense {
        w: Array::random_normal(kiln::random::Key::new(0), &[3, 4], DType::F32)?,
        b: Array::zeros(&[4], DType::F32),
    };
    let out = layer.call(&(params.clone(), x.clone()))?;
    println!("dense out {}: {:?}", out.aval(), out.to_vec::<f32>()?);
    layer.call(&(params.clone(), x))?;

    // A new batch size misses the cache, and the cache says why.
    layer.call(&(params, Array::ones(&[5, 3], DType::F32)))?;
    let cache = layer.cache();
    println!("cache: {}", cache.summary());
    if let Some(miss) = cache.last_miss() {
        for reason in &miss.reasons {
            println!("  miss on call {}: {reason}", miss.call);
        }
    }
    Ok(())
}
