//! An independent check of a lowered program, sharing nothing with the
//! lowering: what any executor may rely on.

use super::types::{Buffer, Caps, Program, Range, Step};

impl Program {
    /// Checks what an executor relies on, given the bytes of each argument
    /// buffer: every range lies inside its buffer with a positive size in
    /// whole words; every binding offset is aligned as `caps` requires and
    /// every dispatch binds at most `caps`' storage buffers on a grid
    /// within its limits; copies join two different buffers; no two
    /// bindings of one dispatch overlap (WebGPU rejects overlapping
    /// writable bindings; an in-place operand is read through the output
    /// binding); every kernel reads its parameters from the parameter
    /// buffer, and nothing else binds it; parameters, constants and
    /// status words lie outside the plan's slots; status words are cleared
    /// before any kernel runs; every loop's branch reads one arena word and
    /// leaves forward, and every jump goes back over a branch that leaves
    /// to the step after it; and every non-empty output is written.
    /// `Err` says which step broke which rule.
    pub fn check(&self, caps: &Caps, input_bytes: &[u64]) -> Result<(), String> {
        let inside = |range: &Range, what: &str| -> Result<(), String> {
            let size = match range.buffer {
                Buffer::Arena => self.arena_bytes,
                Buffer::Params => self.params_bytes,
                Buffer::Input(i) => *input_bytes
                    .get(i)
                    .ok_or_else(|| format!("{what} reads argument {i}, which does not exist"))?,
                Buffer::Output(o) => {
                    self.outputs
                        .get(o)
                        .ok_or_else(|| format!("{what} names output {o}, which does not exist"))?
                        .bytes
                }
            };
            if range.bytes == 0 || !range.bytes.is_multiple_of(4) || !range.offset.is_multiple_of(4)
            {
                return Err(format!("{what}: {range:?} is not whole words"));
            }
            if range.end() > size {
                return Err(format!(
                    "{what}: {range:?} ends past its buffer's {size} bytes"
                ));
            }
            Ok(())
        };
        let slots = self.arena_use.slots;
        let in_slots = |range: &Range| range.buffer == Buffer::Arena && range.offset < slots;
        let mut written = vec![false; self.outputs.len()];
        let mut kernels_ran = false;
        for (s, step) in self.steps.iter().enumerate() {
            match step {
                Step::Dispatch(d) => {
                    kernels_ran = true;
                    let what = format!("step {s} (`{}`)", d.op);
                    if d.bindings.len() < 2 {
                        return Err(format!("{what} binds no output"));
                    }
                    if d.bindings.len() > caps.max_storage_buffers_per_stage as usize {
                        return Err(format!(
                            "{what} binds {} buffers, more than {}",
                            d.bindings.len(),
                            caps.max_storage_buffers_per_stage
                        ));
                    }
                    if d.grid
                        .iter()
                        .any(|&g| g > caps.max_workgroups_per_dimension)
                    {
                        return Err(format!("{what} has grid {:?}", d.grid));
                    }
                    for (b, range) in d.bindings.iter().enumerate() {
                        inside(range, &format!("{what} binding {b}"))?;
                        if !range
                            .offset
                            .is_multiple_of(u64::from(caps.binding_offset_alignment))
                        {
                            return Err(format!("{what} binding {b}: {range:?} is not aligned"));
                        }
                        if range.bytes > caps.max_binding_bytes {
                            return Err(format!("{what} binding {b}: {range:?} is too large"));
                        }
                    }
                    if d.bindings[0].buffer != Buffer::Params {
                        return Err(format!(
                            "{what} reads its parameters from {:?}",
                            d.bindings[0]
                        ));
                    }
                    if let Some(b) = d
                        .bindings
                        .iter()
                        .skip(1)
                        .position(|r| r.buffer == Buffer::Params)
                    {
                        return Err(format!("{what} binds the parameter buffer at {}", b + 1));
                    }
                    let output = d.bindings[1];
                    for (b, range) in d.bindings.iter().enumerate().skip(1) {
                        if let Some(a) = (0..b).find(|&a| d.bindings[a].overlaps(range)) {
                            return Err(format!(
                                "{what}: binding {b} {range:?} overlaps binding {a} {:?}",
                                d.bindings[a]
                            ));
                        }
                    }
                    if let Buffer::Output(o) = output.buffer {
                        written[o] = true;
                    }
                }
                Step::Copy { from, to } => {
                    inside(from, &format!("step {s} (copy from)"))?;
                    inside(to, &format!("step {s} (copy to)"))?;
                    if from.buffer == to.buffer {
                        return Err(format!("step {s} copies {from:?} within one buffer"));
                    }
                    if from.bytes != to.bytes {
                        return Err(format!("step {s} copies {from:?} into {to:?}"));
                    }
                    if let Buffer::Output(o) = to.buffer {
                        written[o] = true;
                    }
                }
                Step::Clear(range) => {
                    inside(range, &format!("step {s} (clear)"))?;
                    if kernels_ran {
                        return Err(format!("step {s} clears {range:?} after a kernel ran"));
                    }
                }
                Step::Branch { predicate, exit } => {
                    inside(predicate, &format!("step {s} (branch)"))?;
                    if predicate.buffer != Buffer::Arena || predicate.bytes != 4 {
                        return Err(format!(
                            "step {s} reads its predicate from {predicate:?}, not one arena word"
                        ));
                    }
                    if *exit <= s || *exit > self.steps.len() {
                        return Err(format!("step {s} leaves its loop to step {exit}"));
                    }
                }
                Step::Jump { to } => {
                    // Only back to a loop's test, so every loop ends at a branch.
                    let closes_a_loop = *to < s
                        && self.steps[*to..s].iter().any(
                            |step| matches!(step, Step::Branch { exit, .. } if *exit == s + 1),
                        );
                    if !closes_a_loop {
                        return Err(format!(
                            "step {s} jumps to step {to}, not back over a branch leaving to step {}",
                            s + 1
                        ));
                    }
                }
            }
        }
        for check in &self.checks {
            inside(&check.word, &format!("the status word of `{}`", check.op))?;
            if in_slots(&check.word) {
                return Err(format!("the status word of `{}` lies in a slot", check.op));
            }
            let cleared = self
                .steps
                .iter()
                .any(|step| matches!(step, Step::Clear(range) if *range == check.word));
            if !cleared {
                return Err(format!(
                    "the status word of `{}` is never cleared",
                    check.op
                ));
            }
        }
        for init in &self.arena_init {
            let end = init.offset + 4 * init.words.len() as u64;
            if init.offset < slots || end > self.arena_bytes {
                return Err(format!(
                    "initial data at bytes {}..{end} lies in the slots or past the arena",
                    init.offset
                ));
            }
        }
        for init in &self.params_init {
            let end = init.offset + 4 * init.words.len() as u64;
            if end > self.params_bytes {
                return Err(format!(
                    "parameters at bytes {}..{end} overflow their buffer",
                    init.offset
                ));
            }
        }
        match written
            .iter()
            .zip(&self.outputs)
            .position(|(&w, output)| !w && output.len > 0)
        {
            Some(o) => Err(format!("output {o} is never written")),
            None => Ok(()),
        }
    }
}
