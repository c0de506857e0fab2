// `#[derive(Parameters)]` in its forms: rename (to a dotted name), flatten, skip, `Vec`, `Option`,
// array and `Box` fields, a tuple struct, structs generic over their blocks and over their element,
// and `#[param(element = "f64")]`. The names are the field paths.
#![deny(warnings)]

use tensorscope::{Element, Param, Parameters, Pool};

/// Fields of a tuple struct are named by their index.
#[derive(Parameters)]
struct Pair(Param, Param);

#[derive(Parameters)]
struct Projection {
    weight: Param,
    bias: Param,
}

#[derive(Parameters)]
struct Norm {
    #[param(rename = "gamma")]
    weight: Param,
    #[param(rename = "beta.value")]
    bias: Option<Param>,
    #[param(skip)]
    eps: f32,
}

#[derive(Parameters)]
struct Block {
    #[param(flatten)]
    proj: Projection,
    norm: Box<Norm>,
    heads: [Param; 2],
    pair: Pair,
}

/// Generic over its blocks: the impl holds where `Vec<B>` is a set of parameters.
#[derive(Parameters)]
struct Model<B> {
    blocks: Vec<B>,
    head: Option<Param>,
    #[param(skip)]
    name: String,
}

#[derive(Parameters)]
#[param(element = "f64")]
struct Wide {
    w: Param<f64>,
}

/// The element is the type parameter bounded by `Element`.
#[derive(Parameters)]
struct Scale<T: Element> {
    s: Param<T>,
}

fn names<T: Element>(params: &impl Parameters<T>) -> Vec<String> {
    params
        .named_params()
        .into_iter()
        .map(|(name, _)| name)
        .collect()
}

pub(crate) fn main() {
    let pool = Pool::with_max_memory_mb(16);
    let p = |n: usize| Param::<f32>::zeros(&pool, &[n]);
    let block = |bias: bool| Block {
        proj: Projection {
            weight: p(4),
            bias: p(2),
        },
        norm: Box::new(Norm {
            weight: p(2),
            bias: bias.then(|| p(2)),
            eps: 1e-5,
        }),
        heads: [p(1), p(1)],
        pair: Pair(p(3), p(3)),
    };
    let mut model = Model {
        blocks: vec![block(true), block(false)],
        head: None,
        name: "m".into(),
    };
    assert_eq!(
        names(&model),
        [
            "blocks.0.weight",
            "blocks.0.bias",
            "blocks.0.norm.gamma",
            "blocks.0.norm.beta.value",
            "blocks.0.heads.0",
            "blocks.0.heads.1",
            "blocks.0.pair.0",
            "blocks.0.pair.1",
            "blocks.1.weight",
            "blocks.1.bias",
            "blocks.1.norm.gamma",
            "blocks.1.heads.0",
            "blocks.1.heads.1",
            "blocks.1.pair.0",
            "blocks.1.pair.1",
        ]
    );
    assert_eq!(model.param_count(), 2 * (4 + 2 + 2 + 1 + 1 + 3 + 3) + 2);
    assert_eq!(
        model.param("blocks.1.pair.0").map(|w| w.shape().to_vec()),
        Some(vec![3])
    );
    assert!(model.param("blocks.1.norm.beta.value").is_none());

    // The mutable walk visits the same parameters.
    model.head = Some(p(5));
    let mut visited = 0;
    model.for_each_param(&mut |_| visited += 1);
    assert_eq!(
        (visited, names(&model).last().map(String::as_str)),
        (16, Some("head"))
    );
    assert_eq!((model.name.as_str(), model.blocks[0].norm.eps), ("m", 1e-5));

    let wide = Wide {
        w: Param::<f64>::zeros(&pool, &[2]),
    };
    assert_eq!(names::<f64>(&wide), ["w"]);
    let scale = Scale {
        s: Param::<f64>::zeros(&pool, &[1]),
    };
    assert_eq!(names::<f64>(&scale), ["s"]);
}
