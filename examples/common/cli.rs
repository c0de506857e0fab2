//! The command line of the examples that take whole numbers: `--name value` pairs.
//!
//! Shared by `examples/checkpointed_training.rs` and `examples/custom_op.rs` through `#[path]`.

/// Reads `--name value` pairs from the command line into `options` (each a name with its leading
/// `--` and the number it sets, which keeps its value when the name is not given). Exits with a
/// message naming the argument at fault for an unknown name or a value that is not a whole
/// number.
pub(crate) fn whole_numbers(options: &mut [(&str, &mut usize)]) {
    let raw: Vec<String> = std::env::args().skip(1).collect();
    let fail = |message: String| -> ! {
        eprintln!("{message}");
        std::process::exit(2)
    };
    for pair in raw.chunks(2) {
        let Some((_, slot)) = options.iter_mut().find(|(name, _)| *name == pair[0]) else {
            let names: Vec<&str> = options.iter().map(|(name, _)| *name).collect();
            fail(format!(
                "unknown argument {}; accepted: {}",
                pair[0],
                names.join(" ")
            ))
        };
        **slot = pair
            .get(1)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| fail(format!("{} needs a whole number", pair[0])));
    }
}
