// `#[derive(Parameters)]` on enums: a list of mixed blocks, as PyTorch's `nn.ModuleList` holds
// them. A variant holding one unnamed value is that value (its parameters at the enum's path, as
// `blocks.0.weight`); other variants' fields are named as a struct's (by name, or by index); unit
// variants hold none; field options apply as in a struct. Walks are by variant held.
#![deny(warnings)]

use tensorscope::{Param, Parameters, Pool};

#[derive(Parameters)]
struct Projection {
    weight: Param,
    bias: Param,
}

#[derive(Parameters)]
enum Block {
    Project(Projection),
    Scaled {
        #[param(rename = "scale.value")]
        scale: Param,
        #[param(skip)]
        eps: f32,
    },
    Pair(Param, Param),
    Identity,
}

#[derive(Parameters)]
struct Model {
    blocks: Vec<Block>,
}

fn main() {
    let pool = Pool::with_max_memory_mb(16);
    let p = || Param::from_slice(&pool, &[1], &[0.0]);
    let mut model = Model {
        blocks: vec![
            Block::Project(Projection {
                weight: p(),
                bias: p(),
            }),
            Block::Identity,
            Block::Scaled {
                scale: p(),
                eps: 1e-5,
            },
            Block::Pair(p(), p()),
        ],
    };
    if let Block::Scaled { eps, .. } = &model.blocks[2] {
        assert_eq!(*eps, 1e-5);
    }
    let names: Vec<String> = model.named_params().into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        names,
        [
            "blocks.0.weight",
            "blocks.0.bias",
            "blocks.2.scale.value",
            "blocks.3.0",
            "blocks.3.1",
        ]
    );
    let mut count = 0;
    model.for_each_param(&mut |_| count += 1);
    assert_eq!(count, 5);
}
