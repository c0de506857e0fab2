//! Attribute and derive macros of [tensorscope](https://docs.rs/tensorscope). Use them through the
//! `tensorscope` crate, which re-exports them; the code they generate calls
//! `::tensorscope::__private` only.
//!
//! - [`macro@dispose_scope`]: run a forward function in its own child scope and escape its result.
//! - [`derive@Escape`]: let a struct of tensors be returned from a scope.
//! - [`macro@checkpoint`]: store the inputs of a few layers of a forward pass and recompute the
//!   others when the backward pass needs them.

use proc_macro::TokenStream;

mod args;
mod checkpoint;
mod dispose;
mod escape;
mod item;
mod params;

/// Runs the function body in a child scope of the caller's and escapes its return value, so every
/// tensor the body makes is released when it drops (at the function's end at the latest) and the
/// result lands in the caller's scope.
///
/// ```
/// use tensorscope::prelude::*;
///
/// #[dispose_scope]
/// fn block<'a>(x: &Tensor<'a>, w1: &Param, w2: &Param) -> Tensor<'a> {
///     let h = x.matmul(w1).gelu(); // rented in the function's own scope, released at the end
///     &h.matmul(w2) + x            // escaped to the caller's scope
/// }
///
/// let pool = Pool::with_max_memory_mb(64);
/// let w1 = Param::from_slice(&pool, &[4, 8], &[0.1f32; 32]);
/// let w2 = Param::from_slice(&pool, &[8, 4], &[0.1f32; 32]);
/// pool.scope(|s| {
///     let x = s.ones::<f32>(&[2, 4]);
///     let y = block(&x, &w1, &w2);
///     let inner = s.last_child_stats().unwrap();
///     assert_eq!((inner.escaped, inner.leaked), (1, 0));
///     assert_eq!(inner.rented, inner.released + inner.escaped);
///     assert_eq!(y.shape(), &[2, 4]);
/// });
/// ```
///
/// **The parent scope** is that of the parameter carrying the return type's brand: a
/// `&Scope<'a, '_>` parameter (which the body then sees as the child scope), else the deepest of
/// the scopes of the tensor parameters (one named `_x` counts when it has the return type's brand),
/// whatever their element types: a caller's
/// `f(&outer_bias, &inner_x)` opens the child in the inner scope, under its budget, as
/// `&outer_bias + &inner_x` rents there. A [`Param`](../tensorscope/struct.Param.html) carries no
/// brand and is never the parent. If the return type names a lifetime that no such parameter carries
/// (tensors inside a slice, an `Option`, a type alias or `self` are not looked into), or two brands
/// at once, the macro says so at compile time; add a `s: &Scope<'a, '_>` parameter. A return type
/// without lifetimes takes the first scope parameter, else the deepest tensor parameter's scope, else
/// runs in a new outermost scope on
/// [`current_pool`](../tensorscope/fn.current_pool.html), from which only values without a brand
/// (numbers, `Vec`s, `Param`s) can be returned.
///
/// **Tensor parameters** (`Tensor<..>` and `&Tensor<..>` with a plain name not starting with `_`) are
/// rebound into the child, so ops on them rent there; an owned tensor stays unique, so by-value ops on
/// it still write in place. A tensor parameter must outlive the scope the result escapes to: give it
/// the return type's brand (`x: &Tensor<'a>`; a caller's tensor of an enclosing scope converts), or
/// a brand bounded by it (`w: &Tensor<'b>` with `'b: 'a`). One of an unrelated brand could otherwise
/// be handed out to a scope it does not outlive, and does not compile ("explicit lifetime required"). Other inputs (`&[Tensor]`, `Option<&Tensor>`, fields of `self`) are not
/// rebound: ops on them alone rent in their own scope, outside the child and its
/// `max_memory_mb` budget. Parameters (`&Param`) need no rebinding: an op
/// with a tensor rents in the tensor's scope. Inside the body, tensors carry the child's brand, so
/// write `'_` rather than the function's `'a` in local type annotations.
///
/// **The return value** is escaped through [`Escape`](../tensorscope/trait.Escape.html) on every path:
/// the tail expression, `return`, `?` and early returns from loops. Tensors, tuples, arrays, `Vec`,
/// `Option`, `Result` and `#[derive(Escape)]` structs are accepted; a return type without lifetimes
/// (`f32`, an ndarray array) is returned as it is.
///
/// **Options:** `max_memory_mb = N` limits what the child scope and its descendants hold at once
/// (a rent past it fails with the scope budget error); `crate = "path"` names the tensorscope crate
/// when it is re-exported under another path.
///
/// Misuse (`async fn`, `const fn`, `-> !`, `#[track_caller]`, a non-function item, an unknown or
/// repeated option, a wrong value) is a compile error at the offending tokens; the function is still emitted as written so that one mistake does not
/// cascade into errors at every call site.
#[proc_macro_attribute]
pub fn dispose_scope(args: TokenStream, item: TokenStream) -> TokenStream {
    dispose::expand(args.into(), item.into()).into()
}

/// Inserts activation checkpointing into a forward function whose body is a `for` loop over layers
/// that reassigns the activation, or a sequence of `let` statements, each reading the one before
/// it (and, as a UNet's skip connections do, any earlier one). The same
/// function serves inference (it stores the policy's layer inputs) and training (its output's
/// `backward()` replays the layers from them).
///
/// ```
/// use tensorscope::prelude::*;
/// use tensorscope::{CheckpointConfig, Checkpointer, Policy};
///
/// struct Mlp { weights: Vec<Param> }
///
/// impl Mlp {
///     #[checkpoint(every = 2)]
///     fn forward<'a>(&self, ckpt: &mut Checkpointer, x: Tensor<'a>) -> Tensor<'a> {
///         let mut x = x;
///         for w in &self.weights {
///             x = x.matmul(w).tanh(); // one layer: a step of the checkpointed loop
///         }
///         x
///     }
/// }
///
/// let pool = Pool::with_max_memory_mb(64);
/// let mlp = pool.scope(|s| Mlp {
///     weights: (0..6).map(|i| (s.randn::<f32>(&[8, 8], i) * 0.3).detach()).collect(),
/// });
/// let mut ckpt = Checkpointer::new(CheckpointConfig::new(Policy::Every(1)));
/// pool.scope(|s| {
///     let y = mlp.forward(&mut ckpt, s.ones::<f32>(&[2, 8]));
///     assert_eq!(y.shape(), &[2, 8]);
/// });
/// // The attribute's policy applies: the inputs of layers 0, 2 and 4 are stored.
/// assert_eq!(ckpt.stored_layers(), vec![0, 2, 4]);
/// ```
///
/// **Where checkpoints go.** A `&mut Checkpointer` parameter, else the checkpointer installed on this
/// thread with [`Checkpointer::install`](../tensorscope/checkpoint/struct.Checkpointer.html#method.install).
/// The attribute's options are applied to it (`set_config`) before the forward; without options
/// (`#[checkpoint]` alone) its own configuration applies, so one annotated function serves every
/// policy. With neither a checkpointer nor options, the layers run as written. The stored layers
/// are numbered by position: 0 for the first step of the loop or sequence.
///
/// **Training.** In a training scope (or from an input that carries a gradient graph), the layers
/// record what it takes to run them again instead of a graph that keeps their activations, and the
/// output's graph node replays them in the backward pass: segment by segment from the stored
/// inputs (`every`, `sqrt`, explicit positions), by the binomial schedule of a byte budget, or by
/// the fastest schedule whose step fits `memory = "64 MiB"` (`Policy::Memory`: a profiling step
/// measures each layer's time and pool bytes holding the least memory a schedule can, the first
/// training step and each new input shape; every step stays within the budget, and a step that
/// differs from the plan's, another weight shape, is measured again; without a checkpointer the
/// measurements are kept for the function, on its thread).
/// The last segment keeps its graph (its backward comes first). At full precision the loss and
/// every gradient are bit-identical to the same forward without the attribute, but for a parameter
/// or a value from before the region that several steps read (an RNN's weight, a UNet's time
/// embedding), whose per-step contributions are summed segment by segment: its gradient is equal up
/// to that sum's rounding (tested within `2 sqrt(steps)` units of `f32`'s precision of the largest
/// gradient element). In a loop, a step may not read a value of an earlier step other than
/// through its input; in a sequence, a `let` may read any earlier `let` of the sequence (below).
///
/// ```
/// use tensorscope::nn::{Adam, Optimizer};
/// use tensorscope::prelude::*;
/// use tensorscope::{CheckpointConfig, Checkpointer, Policy};
///
/// #[derive(Parameters)]
/// struct Mlp { weights: Vec<Param> }
///
/// impl Mlp {
///     #[checkpoint]
///     fn forward<'a>(&self, ckpt: &mut Checkpointer, x: Tensor<'a>) -> Tensor<'a> {
///         let mut x = x;
///         for w in &self.weights {
///             x = x.matmul(w).tanh();
///         }
///         x
///     }
/// }
///
/// let pool = Pool::with_max_memory_mb(64);
/// let mut mlp = pool.scope(|s| Mlp {
///     weights: (0..16).map(|i| (s.randn::<f32>(&[8, 8], i) * 0.3).detach()).collect(),
/// });
/// let mut ckpt = Checkpointer::new(CheckpointConfig::new(Policy::Sqrt));
/// let mut adam = Adam::new(1e-2);
/// for _ in 0..3 {
///     pool.train(|s| {
///         let y = mlp.forward(&mut ckpt, s.ones::<f32>(&[2, 8]));
///         let loss = y.mse(&s.zeros(&[2, 8]));
///         let grads = loss.backward().unwrap(); // replays the stored segments
///         adam.step(&mut mlp, &grads).unwrap();
///     });
/// }
/// assert_eq!(ckpt.last_backward().unwrap().replayed_steps, 12); // all but the last segment
/// ```
///
/// **Segments.** The layers are grouped by the policy; each group runs in its own child scope of the
/// activation's, so whatever a layer rents is that segment's and is released by its end at the latest.
/// Inside the loop or sequence the activation carries the segment's brand: write `'_` in local type
/// annotations there.
///
/// **The two forms.** A `for pat in iter { ...; act = ...; }` loop (the activation is the variable the
/// body assigns), or two or more `let`s in a row, each reading the one before it or rebinding its
/// name: the first computes the input of the sequence (a call, an operator or a variable, not a
/// field or a constant: `let g = self.groups;` is not an input); each later one is a layer, whose
/// input is the `let` before it. The sequence taken is the one that ends with the variable the
/// function ends with, else the longest. A layer's code cannot `return`, `break`, `continue` or
/// use `?`. An error of the checkpointer (e.g. a NaN in an activation being stored) panics with its
/// message.
///
/// **Skip connections.** A `let` of a sequence may read earlier `let`s besides the one before it: a
/// UNet's up path concatenating the down path's values, a residual from the sequence's input, a
/// DenseNet's step reading every earlier one. The whole path is one checkpointed chain: each value
/// read later is kept from when its layer runs until the last layer that reads it has run its
/// backward (it is not recomputed), and its gradient from that layer's backward is held until the
/// backward reaches it. Each value's gradients add latest reader first, as the plain graph's walk
/// adds them when every read is an operand of the reader's ops (added, concatenated): then the
/// gradients are bit-identical to the function without the attribute under every policy (tested
/// on a UNet, nested skips, a step reading four earlier ones, a value read by three steps or
/// twice in one). A value read through an op of its own (`(&a).tanh()`) or multiplied by itself
/// may be reached by the plain walk in another order: its gradient, and those before it, are
/// then equal up to that sum's rounding. `Policy::Memory` plans a schedule with regions for the budget less a reserve:
/// each such value once, and the values the layer being reversed reads twice; a schedule that
/// records every layer, or the measured least-memory one, needs none (see `docs/design.md`, "Skip
/// connections"). Only the last
/// `let` of the sequence (and the first, its input) can be read after it: a value inside is a
/// compile error there, as is `replay` on a sequence with skips.
///
/// ```
/// use tensorscope::prelude::*;
/// use tensorscope::{CheckpointConfig, Checkpointer, Policy};
///
/// struct Unet { w: Vec<Param> }
///
/// impl Unet {
///     #[checkpoint]
///     fn forward<'a>(&self, ckpt: &mut Checkpointer, x: Tensor<'a>) -> Tensor<'a> {
///         let h = x.tanh();
///         let down1 = h.matmul(&self.w[0]).tanh();
///         let down2 = down1.matmul(&self.w[1]).tanh();
///         let up2 = (down2.matmul(&self.w[2]) + &down1).tanh(); // reads `down1`: a skip
///         let out = up2.matmul(&self.w[3]) + &h; // reads `h`, the sequence's input
///         out
///     }
/// }
///
/// let pool = Pool::with_max_memory_mb(64);
/// let unet = pool.scope(|s| Unet {
///     w: (0..4).map(|i| (s.randn::<f32>(&[8, 8], i) * 0.3).detach()).collect(),
/// });
/// let mut ckpt = Checkpointer::new(CheckpointConfig::new(Policy::Every(1)));
/// pool.train(|s| {
///     let y = unet.forward(&mut ckpt, s.ones::<f32>(&[2, 8]));
///     let grads = y.mse(&s.zeros(&[2, 8])).backward().unwrap();
///     assert_eq!(grads.len(), 4);
/// });
/// // Four layers (`down1` to `out`): all but the last replayed from their stored inputs.
/// assert_eq!(ckpt.last_backward().unwrap().replayed_steps, 3);
/// ```
///
/// **Replay.** `replay = "forward_layer"` also generates `fn forward_layer(<the same receiver and
/// parameters, without the checkpointer and the activation>, x: &Tensor<'r, E>, index: usize) ->
/// Tensor<'r, E>`, which runs layer `index` (the loop body for iteration `index`, or the `index`-th
/// `let` after the first) on `x`: the function `Checkpointer::reverse` and
/// `recompute_from_checkpoint` take, `|x, i| model.forward_layer(x, i)`. It needs the function to
/// return the activation tensor, and the loop's iterable and body to use only parameters (not locals
/// made before the loop); it panics with the index and the layer count for an index past the end.
///
/// **Options:** `every = N`, `policy = "sqrt"` or `memory = "64 MiB"` (B, KB, MB, GB, KiB, MiB,
/// GiB; or none of them: the checkpointer's configuration),
/// with a policy `precision = "f32" | "f16" | "bf16"`, `saving = "products" | "nothing"` (keep the
/// outputs of matrix products, convolutions and attention for the backward's replay instead of
/// running them again: `Saving::Products`; under `memory = ..` the planner keeps them where
/// that is faster within the budget) and `max = M` (at most `M` checkpoints),
/// `replay = "name"`, `crate = "path"`. Misuse is a compile error at the offending tokens, and the
/// function is still emitted as written.
#[proc_macro_attribute]
pub fn checkpoint(args: TokenStream, item: TokenStream) -> TokenStream {
    checkpoint::expand(args.into(), item.into()).into()
}

/// Implements `Escape` for a struct. With one lifetime parameter, the scope brand, fields whose type
/// mentions that lifetime are escaped and the others are moved as they are; with none, the value
/// passes through unchanged (so it can sit in a tuple next to tensors). `#[escape(crate = "path")]`
/// names the tensorscope crate when it is re-exported under another path.
///
/// ```
/// use tensorscope::prelude::*;
///
/// #[derive(Escape)]
/// struct Output<'s> {
///     logits: Tensor<'s>,
///     hidden: Vec<Tensor<'s>>,
///     steps: usize,
/// }
///
/// #[dispose_scope]
/// fn run<'a>(x: &Tensor<'a>) -> Output<'a> {
///     let h = x * 2.0;
///     Output { logits: &h + 1.0, hidden: vec![h], steps: 1 }
/// }
///
/// tensorscope::scope(|s| {
///     let out = run(&s.ones::<f32>(&[3]));
///     assert_eq!(out.logits.to_vec(), vec![3.0; 3]);
///     assert_eq!((out.hidden.len(), out.steps), (1, 1));
/// });
/// ```
#[proc_macro_derive(Escape, attributes(escape))]
pub fn derive_escape(input: TokenStream) -> TokenStream {
    escape::derive(input.into()).into()
}

/// Implements `Parameters` for a model struct or enum: each field is walked under its name (the elements of
/// a `Vec` or an array under their index, an `Option` when it holds a value), so the parameters'
/// names are their field paths, `blocks.3.mlp.w1`, as in PyTorch's `state_dict()`. A field's type
/// must be a set of parameters (`Param`, a module, a `Vec`, array, `Box` or `Option` of them);
/// another is a compile error at the field. Two fields may hold one parameter (a clone of one
/// `Param`, as a head tied to an embedding): it is trained and counted once and saved under both
/// names (see `Parameters`' "Tied parameters").
///
/// An enum (a list of mixed blocks, as `nn.ModuleList` holds them) walks the variant it holds: a
/// variant of one unnamed value (`Res(ResBlock)`) is that value, so a `Vec<Block>` names its
/// parameters `blocks.0.conv1.weight` whichever variant each block is; other variants' fields
/// are named as a struct's (`Pair(Param, Param)`: `0` and `1`); a unit variant holds none. A
/// variant holding a bare `Param` is named by the enum's path, so at the root it is named `""`,
/// as a `Param` walked alone is: give it a name with `#[param(rename = "..")]`. A union is
/// refused.
///
/// Field options: `#[param(rename = "c_fc.weight")]` walks the field under another name (a file's);
/// `#[param(flatten)]` walks it under its parent's path (a wrapper's fields as its own);
/// `#[param(skip)]` leaves it out (a field that holds no parameters, or frozen ones).
///
/// Struct options: `#[param(element = "f64")]` names the parameters' element type, which is
/// otherwise the struct's type parameter bounded by `Element`, or `f32`; `#[param(crate = "path")]`
/// names the tensorscope crate when it is re-exported under another path.
///
/// ```
/// use tensorscope::nn::Linear;
/// use tensorscope::{Parameters, Pool};
///
/// #[derive(Parameters)]
/// struct TwoLayer {
///     #[param(rename = "c_fc")]
///     up: Linear,
///     down: Linear,
///     #[param(skip)]
///     name: String,
/// }
///
/// let pool = Pool::with_max_memory_mb(16);
/// let model = TwoLayer {
///     up: Linear::new(&pool, 4, 8, 0).unwrap(),
///     down: Linear::new(&pool, 8, 4, 1).unwrap(),
///     name: "mlp".into(),
/// };
/// let names: Vec<String> = model.named_params().into_iter().map(|(n, _)| n).collect();
/// assert_eq!(names, ["c_fc.weight", "c_fc.bias", "down.weight", "down.bias"]);
/// ```
#[proc_macro_derive(Parameters, attributes(param))]
pub fn derive_parameters(input: TokenStream) -> TokenStream {
    params::derive(input.into()).into()
}
