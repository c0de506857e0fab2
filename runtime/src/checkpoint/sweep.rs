//! Recomputing activations from the checkpoints, and the reverse sweep.

#[cfg(doc)]
use super::binomial_recompute_steps;
use super::stored::ByLayer;
use super::{schedule, CheckpointError, Checkpointer, Result};
use crate::dims::Dims;

use crate::element::Element;
use crate::error::Shape;
use crate::scope::{Scope, State};
use crate::tensor::Tensor;

/// What a reverse sweep did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct ReverseReport {
    /// Layer steps recomputed (forward evaluations beyond the original forward pass) to obtain
    /// activations that were not stored.
    pub recomputed_steps: usize,
    /// Layer steps run again with recording on, to build their graph for the backward pass (a
    /// checkpointed region's backward: each layer once).
    pub replayed_steps: usize,
    /// The most activations held at once: stored checkpoints plus recomputed ones (0 under
    /// [`Policy::Memory`](super::Policy::Memory), whose plan counts bytes, not activations: the
    /// pool's peak is its measure).
    pub peak_activations: usize,
    /// Ops run again by the replays of checkpointed regions (recomputations and replays that
    /// record alike).
    pub replayed_ops: usize,
    /// Ops whose output a tape kept and a replay bound instead of running them: those that
    /// [`Saving`](super::Saving) names, and ops without a derivative (`map`).
    pub kept_ops: usize,
}

impl<T: Element> Checkpointer<T> {
    fn position(&self, layer: usize, layers: &[usize]) -> Result<usize> {
        layers
            .iter()
            .position(|&l| l == layer)
            .ok_or(CheckpointError::BadLayer {
                layer,
                problem: "is not in",
                count: layers.len(),
            })
    }

    /// The input of `target_layer`, recomputed by replaying `forward` from the nearest checkpoint at or
    /// before it. With full precision it equals the forward pass's value bit for bit; with `f16`/`bf16`
    /// storage it carries their rounding. Fails with [`CheckpointError::BadLayer`],
    /// [`CheckpointError::UnknownLayer`] (no checkpoint at or before it) or
    /// [`CheckpointError::ShapeDrift`] (a replayed layer gave another shape than in the forward).
    /// The replay runs in `s`: the stored activation is bound there and `forward`'s outputs rent there.
    pub fn recompute_from_checkpoint<'s>(
        &self,
        s: &Scope<'s, '_>,
        target_layer: usize,
        layers: &[usize],
        mut forward: impl FnMut(&Tensor<'s, T>, usize) -> Tensor<'s, T>,
    ) -> Result<Tensor<'s, T>> {
        let target = self.position(target_layer, layers)?;
        let start = (0..=target)
            .rev()
            .find(|&p| self.stored.contains(layers[p]))
            .ok_or_else(|| CheckpointError::UnknownLayer {
                layer: target_layer,
                stored: self.stored_layers(),
            })?;
        let stored = self.stored.get(layers[start]).expect("found above");
        let mut x: Tensor<'s, T> = stored.restore(s.state())?;
        // Shapes are only comparable when replaying the forward's own layer list.
        let shapes: &[Dims] = if layers == self.layers {
            &self.shapes
        } else {
            &[]
        };
        for pos in start..target {
            x = forward(&x, layers[pos]);
            check_shape(shapes, layers, pos + 1, &x)?;
        }
        Ok(x)
    }

    /// The reverse sweep after [`Checkpointer::checkpointed_forward`]: calls `backward(layer, input)`
    /// for every layer of that forward, last first, with the layer's input activation, recomputing
    /// activations from the checkpoints with `forward` (which must be the forward's function). Under
    /// `Every`, `Sqrt` and `Explicit` each segment is recomputed once and held while its layers run
    /// backward; under `Budget` the binomial schedule reuses the slots and recomputes
    /// [`binomial_recompute_steps`] steps. The checkpoints are consumed (dropped as their segments
    /// finish). The sweep runs in `s`: checkpoints are bound there and recomputed activations rent
    /// there.
    pub fn reverse<'s>(
        &mut self,
        s: &Scope<'s, '_>,
        forward: impl FnMut(&Tensor<'s, T>, usize) -> Tensor<'s, T>,
        backward: impl FnMut(usize, &Tensor<'s, T>),
    ) -> Result<ReverseReport> {
        let (mut forward, mut backward) = (forward, backward);
        self.reverse_in(
            s.state(),
            |x, layer| Ok(forward(x, layer)),
            |layer, x| {
                backward(layer, x);
                Ok(())
            },
        )
    }

    /// [`Checkpointer::reverse`] in the scope with `state`.
    pub(crate) fn reverse_in<'s>(
        &mut self,
        state: &State,
        mut forward: impl FnMut(&Tensor<'s, T>, usize) -> Result<Tensor<'s, T>>,
        mut backward: impl FnMut(usize, &Tensor<'s, T>) -> Result<()>,
    ) -> Result<ReverseReport> {
        if self.swept || (self.plan.is_empty() && !self.layers.is_empty()) {
            // Already swept (or cleared): the checkpoints are gone.
            return Err(CheckpointError::UnknownLayer {
                layer: self.layers[0],
                stored: Vec::new(),
            });
        }
        if self.layers.is_empty() && !self.stored.is_empty() {
            return Err(CheckpointError::NoForward {
                stored: self.stored.len(),
            });
        }
        let mut sweep = Sweep {
            scope: state,
            stored: std::mem::take(&mut self.stored),
            layers: &self.layers,
            shapes: &self.shapes,
            forward: &mut forward,
            backward: &mut backward,
            report: ReverseReport::default(),
            held: 0,
        };
        // The schedule the forward planned, whatever the config says now.
        let result = if self.slots > 0 {
            sweep.binomial(&self.plan, self.slots)
        } else {
            sweep.segments(&self.plan)
        };
        let report = sweep.report;
        // The checkpoints are consumed; the plan stays, for `is_checkpoint_layer`.
        drop(sweep);
        self.swept = true;
        self.handed.clear();
        result.map(|()| report)
    }
}

/// Fails with [`CheckpointError::ShapeDrift`] if `x`, the recomputed activation at `pos`, differs in
/// shape from the forward's (`shapes`, empty when not comparable).
pub(super) fn check_shape<T: Element>(
    shapes: &[Dims],
    layers: &[usize],
    pos: usize,
    x: &Tensor<'_, T>,
) -> Result<()> {
    match shapes.get(pos) {
        Some(expected) if expected.slice() != x.shape() => Err(CheckpointError::ShapeDrift {
            layer: layers[pos],
            expected: Shape::from(expected.slice()),
            got: Shape::from(x.shape()),
        }),
        _ => Ok(()),
    }
}

/// A layer step of a sweep: the next activation from this one and the layer's id.
pub(super) type StepForward<'f, 's, T> =
    dyn FnMut(&Tensor<'s, T>, usize) -> Result<Tensor<'s, T>> + 'f;

/// The state of a reverse sweep. It owns the checkpoints and drops each once consumed.
pub(super) struct Sweep<'c, 'f, 's, T: Element> {
    /// Where restored checkpoints are bound.
    pub(super) scope: &'c State,
    pub(super) stored: ByLayer<T>,
    pub(super) layers: &'c [usize],
    pub(super) shapes: &'c [Dims],
    pub(super) forward: &'f mut StepForward<'f, 's, T>,
    pub(super) backward: &'f mut dyn FnMut(usize, &Tensor<'s, T>) -> Result<()>,
    pub(super) report: ReverseReport,
    /// Activations alive now besides the stored checkpoints.
    pub(super) held: usize,
}

impl<'s, T: Element> Sweep<'_, '_, 's, T> {
    fn note_peak(&mut self) {
        let now = self.held + self.stored.len();
        self.report.peak_activations = self.report.peak_activations.max(now);
    }

    /// `steps` layer steps from `x` at position `pos`, counted as recomputation.
    fn advance(&mut self, x: &Tensor<'s, T>, pos: usize, steps: usize) -> Result<Tensor<'s, T>> {
        let mut x = x.clone();
        for p in pos..pos + steps {
            x = (self.forward)(&x, self.layers[p])?;
            check_shape(self.shapes, self.layers, p + 1, &x)?;
        }
        self.report.recomputed_steps += steps;
        Ok(x)
    }

    /// Takes the checkpoint at `pos` out of the store: from here on it is an ordinary activation.
    pub(super) fn checkpoint(&mut self, pos: usize) -> Result<Tensor<'s, T>> {
        let layer = self.layers[pos];
        match self.stored.remove(layer) {
            Some(stored) => stored.restore(self.scope),
            None => Err(CheckpointError::UnknownLayer {
                layer,
                stored: self.stored.layers(),
            }),
        }
    }

    /// Segment by segment, last first: recompute the segment from its checkpoint, run its layers
    /// backward, drop it.
    fn segments(&mut self, plan: &[usize]) -> Result<()> {
        let n = self.layers.len();
        for (j, &start) in plan.iter().enumerate().rev() {
            let end = plan.get(j + 1).copied().unwrap_or(n);
            let mut acts = vec![self.checkpoint(start)?];
            for pos in start + 1..end {
                let next = self.advance(&acts[acts.len() - 1], pos - 1, 1)?;
                acts.push(next);
            }
            self.held = acts.len();
            self.note_peak();
            for pos in (start..end).rev() {
                (self.backward)(self.layers[pos], &acts[pos - start])?;
            }
            self.held = 0;
        }
        Ok(())
    }

    /// The binomial schedule: the forward stored a chain; reverse its last link with the slots left,
    /// then each earlier link with one slot more.
    pub(super) fn binomial(&mut self, chain: &[usize], slots: usize) -> Result<()> {
        let n = self.layers.len();
        self.note_peak();
        for (j, &start) in chain.iter().enumerate().rev() {
            let end = chain.get(j + 1).copied().unwrap_or(n);
            // The link's own checkpoint is one of its slots.
            let x = self.checkpoint(start)?;
            self.held += 1;
            self.reverse_paid(start, x, end - start, slots - j)?;
            self.held -= 1;
        }
        Ok(())
    }

    /// Reverses `len` steps from `x` (the activation at `pos`, holding one slot) with `slots` slots,
    /// paying for every advance: Griewank and Walther's recursion.
    fn reverse_paid(
        &mut self,
        pos: usize,
        x: Tensor<'s, T>,
        len: usize,
        slots: usize,
    ) -> Result<()> {
        if len == 1 {
            return (self.backward)(self.layers[pos], &x);
        }
        if slots == 1 {
            for j in (0..len).rev() {
                let a = self.advance(&x, pos, j)?;
                self.held += 1;
                self.note_peak();
                (self.backward)(self.layers[pos + j], &a)?;
                self.held -= 1;
            }
            return Ok(());
        }
        let m = schedule::paid_split(len as u64, slots as u64) as usize;
        let right = self.advance(&x, pos, m)?;
        self.held += 1;
        self.note_peak();
        self.reverse_paid(pos + m, right, len - m, slots - 1)?;
        self.held -= 1;
        self.reverse_paid(pos, x, m, slots)
    }
}
