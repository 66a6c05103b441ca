//! Planning: a pipeline, its variables and sweep cells expanded into the
//! concrete step instances to run, in dependency order, each with its
//! output directory and full command line.
//!
//! An instance's directory is `OUT/<step>` (setup) or `OUT/it<i>/<step>`
//! (loop), plus `@var=value,…` naming the swept variables it depends on,
//! directly or through the steps and policy it reads. Cells that agree on
//! those variables therefore share the instance, and it runs once.
//!
//! The plan is built whole, before anything runs, so its size is bounded: a
//! pipeline whose sweep cells, setup steps and loop iterations make more
//! than [`MAX_INSTANCES`] step instances is refused (bad input, at the line
//! of `iterations` or of the sweep) before any is expanded. A path a step
//! reads from an earlier step's directory must be something that step's
//! stage declares it writes ([`embodyflow_core::spec`]): an input the
//! directory itself or one of its tables, a `policy` or `teacher` (and the
//! loop's `init_policy` and `policy`) one of its checkpoints, a
//! `skip_if_empty` one of its tables; anything else is an error at its line.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use embodyflow_core::spec::{Output, StageSpec};
use serde::{Deserialize, Serialize};

use crate::backend::Resources;
use crate::error::{Result, RunnerError};
use crate::pipeline::{LoopDef, Pipeline, StepDef, Template, render};

/// The most step instances a plan may have (sweep cells times setup and
/// loop steps, each one a stage run).
pub const MAX_INSTANCES: u64 = 100_000;

/// One sweep cell: the values of the swept variables.
#[derive(Debug, Clone, PartialEq)]
pub struct Cell {
    /// `var=value,…` (`default` when nothing is swept).
    pub name: String,
    /// The swept variables' values.
    pub values: Vec<(String, String)>,
}

/// A step run once: a setup step, or a loop step in one iteration, in one
/// group of sweep cells. It is written as JSON for the cluster job that runs
/// it ([`crate::slurm`]), the stage by name.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Instance {
    /// Directory relative to the run directory, e.g. `it0/collect`.
    pub id: String,
    /// The step's name.
    pub step: String,
    /// The stage it runs.
    #[serde(with = "stage_name")]
    pub stage: &'static StageSpec,
    /// Iteration of a loop step.
    pub iteration: Option<u32>,
    /// Line of the step in the pipeline file.
    pub line: usize,
    /// Line of its `config` (or of the step).
    pub config_line: usize,
    /// Output directory.
    pub dir: PathBuf,
    /// `--input` directories.
    pub inputs: Vec<PathBuf>,
    /// `--policy`.
    pub policy: Option<PathBuf>,
    /// `--teacher`.
    pub teacher: Option<PathBuf>,
    /// `--config`.
    pub config: Option<PathBuf>,
    /// `--set` key, value and line (0: command line), later wins.
    pub sets: Vec<(String, String, usize)>,
    /// `--seed`.
    pub seed: Option<u64>,
    /// Parallel shards.
    pub shards: u32,
    /// Devices for the shards, in turn.
    pub devices: Vec<String>,
    /// What one of its processes asks a cluster for.
    pub resources: Resources,
    /// Extra arguments.
    pub extra: Vec<String>,
    /// When this table has no rows the stage is not run (see `StepDef`).
    pub skip_if_empty: Option<PathBuf>,
    /// Instances it reads from (indices into the plan).
    pub deps: BTreeSet<usize>,
    /// Variables it depends on, directly or through its inputs.
    pub vars: BTreeSet<String>,
    /// Paths it reads that no step of the plan writes (must exist).
    pub external: Vec<PathBuf>,
    /// The sweep cells that use it.
    pub cells: Vec<usize>,
}

/// A stage in JSON: its name.
mod stage_name {
    use embodyflow_core::spec::{self, StageSpec};
    use serde::{Deserialize, Deserializer, Serializer, de::Error};

    pub fn serialize<S: Serializer>(stage: &&'static StageSpec, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(stage.name)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<&'static StageSpec, D::Error> {
        let name = String::deserialize(d)?;
        spec::stage(&name).ok_or_else(|| D::Error::custom(format!("unknown stage `{name}`")))
    }
}

impl Instance {
    /// The stage's arguments except `--out`, `--shard` and `--device`.
    pub fn stage_args(&self) -> Vec<String> {
        let mut args = Vec::new();
        for input in &self.inputs {
            args.push("--input".into());
            args.push(input.display().to_string());
        }
        if let Some(policy) = &self.policy {
            args.push("--policy".into());
            args.push(policy.display().to_string());
        }
        if let Some(teacher) = &self.teacher {
            args.push("--teacher".into());
            args.push(teacher.display().to_string());
        }
        if let Some(config) = &self.config {
            args.push("--config".into());
            args.push(config.display().to_string());
        }
        for (key, value, _) in &self.sets {
            args.push("--set".into());
            args.push(format!("{key}={value}"));
        }
        if let Some(seed) = self.seed {
            args.push("--seed".into());
            args.push(seed.to_string());
        }
        args.extend(self.extra.iter().cloned());
        args
    }
}

/// The instances of a run, in an order where every instance comes after
/// those it reads.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The pipeline file.
    pub file: PathBuf,
    /// The pipeline's name.
    pub name: String,
    /// The run directory.
    pub out: PathBuf,
    /// Instances in run order.
    pub instances: Vec<Instance>,
    /// The sweep cells (one, `default`, without a sweep).
    pub cells: Vec<Cell>,
    /// The swept variables.
    pub swept: Vec<String>,
    /// Gymnasium bridge workers kept warm across the steps (0: none).
    pub keep_workers: u32,
}

/// `pipeline --set` overrides: variables, and `STEP.key=value` stage settings.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Overrides {
    /// Variable values.
    pub vars: Vec<(String, String)>,
    /// Step, dotted key, value.
    pub step_sets: Vec<(String, String, String)>,
}

impl Overrides {
    /// Reads `name=value` (a variable) and `step.key=value` (a stage setting of
    /// every instance of that step).
    pub fn parse(pipeline: &Pipeline, sets: &[String]) -> Result<Overrides> {
        let mut overrides = Overrides::default();
        for set in sets {
            let bad = |message: String| RunnerError::Pipeline {
                file: pipeline.path.clone(),
                line: 0,
                message: format!("--set `{set}`: {message}"),
            };
            let (key, value) = set
                .split_once('=')
                .filter(|(k, _)| !k.trim().is_empty())
                .ok_or_else(|| bad("expected name=value or step.key=value".into()))?;
            let key = key.trim();
            if pipeline.sweep.iter().any(|axis| axis.var == key) {
                return Err(bad(format!(
                    "`{key}` is swept (each cell sets it): give its values with --sweep {key}=a,b"
                )));
            }
            if let Some(renamed) = pipeline.was_renamed(key) {
                return Err(bad(renamed));
            }
            if pipeline.vars.contains_key(key) {
                overrides.vars.push((key.to_string(), value.to_string()));
            } else if let Some((step, rest)) = key.split_once('.')
                && let Some(def) = pipeline.step(step)
            {
                // The cell directories are named by the swept value: a
                // setting that replaces it would run something else under
                // that name.
                let swept = def
                    .sets
                    .iter()
                    .filter(|set| set.key == rest)
                    .find_map(|set| swept_ref(pipeline, &set.value.refs()));
                if let Some(var) = swept {
                    return Err(bad(format!(
                        "step `{step}` sets `{rest}` from the swept variable `{var}` (each cell sets it): give its values with --sweep {var}=a,b"
                    )));
                }
                overrides
                    .step_sets
                    .push((step.to_string(), rest.to_string(), value.to_string()));
            } else {
                return Err(bad(format!(
                    "`{key}` is neither a variable [{}] nor STEP.key with a step of the pipeline [{}]",
                    pipeline.vars.keys().cloned().collect::<Vec<_>>().join(", "),
                    pipeline
                        .steps()
                        .map(|s| s.name.clone())
                        .collect::<Vec<_>>()
                        .join(", ")
                )));
            }
        }
        Ok(overrides)
    }
}

/// The first swept variable among `refs`, directly or through the
/// variables they name.
fn swept_ref(pipeline: &Pipeline, refs: &[String]) -> Option<String> {
    let mut seen = BTreeSet::new();
    let mut todo: Vec<String> = refs.to_vec();
    while let Some(name) = todo.pop() {
        if !seen.insert(name.clone()) {
            continue;
        }
        if pipeline.sweep.iter().any(|axis| axis.var == name) {
            return Some(name);
        }
        if let Some((value, _)) = pipeline.vars.get(&name) {
            todo.extend(crate::pipeline::template_refs(value).unwrap_or_default());
        }
    }
    None
}

/// What a name in a template stands for while planning.
#[derive(Debug, Clone)]
enum Bound {
    /// Text, with the instances and variables it comes from.
    Text {
        text: String,
        deps: BTreeSet<usize>,
        vars: BTreeSet<String>,
    },
    /// A step that does not run here (its `when` or `every`).
    Skipped(String),
}

/// What a path read from an earlier step's directory must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Written {
    /// An `--input`: the directory, or one of the tables in it.
    Input,
    /// A `--policy` or `--teacher`: a checkpoint.
    Checkpoint,
    /// A table (`skip_if_empty`).
    Table,
}

/// A rendered template.
struct Rendered {
    text: String,
    deps: BTreeSet<usize>,
    vars: BTreeSet<String>,
}

struct Builder<'a> {
    pipeline: &'a Pipeline,
    out: PathBuf,
    overrides: &'a Overrides,
    swept: Vec<String>,
    instances: Vec<Instance>,
    by_id: HashMap<String, usize>,
}

impl Builder<'_> {
    fn err(&self, line: usize, message: String) -> RunnerError {
        RunnerError::Pipeline {
            file: self.pipeline.path.clone(),
            line,
            message,
        }
    }

    /// Renders a template; `Ok(None)` when it names a skipped step.
    fn render(
        &self,
        template: &Template,
        ctx: &HashMap<String, Bound>,
    ) -> Result<std::result::Result<Rendered, String>> {
        let mut deps = BTreeSet::new();
        let mut vars = BTreeSet::new();
        for name in template.refs() {
            match ctx.get(&name) {
                Some(Bound::Text {
                    deps: d, vars: v, ..
                }) => {
                    deps.extend(d.iter().copied());
                    vars.extend(v.iter().cloned());
                }
                Some(Bound::Skipped(why)) => return Ok(Err(why.clone())),
                None => {
                    return Err(self.err(template.line, format!("unknown name `${{{name}}}` here")));
                }
            }
        }
        let text = render(&template.text, &mut |name| match ctx.get(name) {
            Some(Bound::Text { text, .. }) => text.clone(),
            _ => String::new(),
        });
        Ok(Ok(Rendered { text, deps, vars }))
    }

    /// Checks that `rendered`, when it is a path inside the directory of a
    /// step it names, is what that step's stage declares it writes, as
    /// `written` needs; `what` and `line` name the field in the error.
    fn check_declared(
        &self,
        rendered: &Rendered,
        written: Written,
        line: usize,
        what: &str,
    ) -> Result<()> {
        let path = Path::new(&rendered.text);
        let Some((producer, rest)) = rendered.deps.iter().find_map(|&d| {
            let producer = &self.instances[d];
            Some((producer, path.strip_prefix(&producer.dir).ok()?))
        }) else {
            return Ok(());
        };
        if rest
            .components()
            .any(|c| !matches!(c, std::path::Component::Normal(_)))
        {
            return Ok(());
        }
        let rest = rest.to_string_lossy();
        let declared = producer.stage.writes.iter().any(|output| match output {
            Output::Table(table) => {
                matches!(written, Written::Input | Written::Table) && rest == table.as_str()
            }
            Output::Checkpoint(at) => {
                written == Written::Checkpoint && (rest == *at || (*at == "." && rest.is_empty()))
            }
            Output::File(_) => false,
        });
        if declared || (written == Written::Input && rest.is_empty()) {
            return Ok(());
        }
        let writes: Vec<String> = producer
            .stage
            .writes
            .iter()
            .map(|o| match o {
                Output::Table(table) => format!("{table}/ (table)"),
                Output::Checkpoint(".") => "its directory itself (checkpoint)".to_string(),
                Output::Checkpoint(at) => format!("{at}/ (checkpoint)"),
                Output::File(at) => format!("{at} (file)"),
            })
            .collect();
        Err(self.err(
            line,
            format!(
                "{what} names {}, which step `{}` ({}) does not write (it writes {}); expected {}",
                rendered.text,
                producer.step,
                producer.stage.name,
                writes.join(", "),
                match written {
                    Written::Input => "its directory or one of its tables",
                    Written::Checkpoint => "one of its checkpoints",
                    Written::Table => "one of its tables",
                }
            ),
        ))
    }

    fn required(
        &self,
        step: &StepDef,
        field: &str,
        template: &Template,
        ctx: &HashMap<String, Bound>,
    ) -> Result<Rendered> {
        self.render(template, ctx)?.map_err(|why| {
            self.err(
                template.line,
                format!("step `{}` field `{field}` names {why}", step.name),
            )
        })
    }

    /// The instance of `step` in this iteration and cell (one that another
    /// cell already made, when they agree on what it reads); what a later
    /// field naming it is bound to.
    fn add(
        &mut self,
        step: &StepDef,
        iteration: Option<u32>,
        ctx: &HashMap<String, Bound>,
        cell: &CellVars,
    ) -> Result<Bound> {
        if let Some(when) = &step.when
            && !when.holds(&cell.vars)
        {
            let Some(instead) = &step.instead else {
                return Ok(Bound::Skipped(format!(
                    "step `{}`, which does not run here (its `when`: {} {} {})",
                    step.name,
                    when.var,
                    if when.equal { "==" } else { "!=" },
                    when.value
                )));
            };
            // The directory standing in for the step's output: an
            // external path, which must exist where a field reads it.
            let mut stand_in = self.required(step, "instead", instead, ctx)?;
            stand_in.vars.insert(when.var.clone());
            return Ok(Bound::Text {
                text: stand_in.text,
                deps: stand_in.deps,
                vars: stand_in.vars,
            });
        }
        let mut reads = Reads {
            vars: step.when.iter().map(|w| w.var.clone()).collect(),
            ..Reads::default()
        };
        let fields = self.fields(step, ctx, &mut reads)?;
        let id = self.instance_id(step, iteration, &reads.vars, &cell.values);
        if let Some(&index) = self.by_id.get(&id) {
            self.instances[index].cells.push(cell.index);
            return Ok(Bound::Text {
                text: self.instances[index].dir.display().to_string(),
                deps: BTreeSet::from([index]),
                vars: self.instances[index].vars.clone(),
            });
        }
        let index = self.instances.len();
        let dir = self.out.join(&id);
        self.instances.push(Instance {
            id: id.clone(),
            step: step.name.clone(),
            stage: step.stage,
            iteration,
            line: step.line,
            config_line: step.config.as_ref().map_or(step.line, |c| c.line),
            dir: dir.clone(),
            inputs: fields.inputs,
            policy: fields.policy,
            teacher: fields.teacher,
            config: fields.config,
            sets: fields.sets,
            seed: fields.seed,
            shards: step.shards,
            devices: step.devices.clone(),
            resources: step.resources.clone(),
            extra: fields.extra,
            skip_if_empty: fields.skip_if_empty,
            deps: reads.deps,
            vars: reads.vars.clone(),
            external: reads.external,
            cells: vec![cell.index],
        });
        self.by_id.insert(id, index);
        Ok(Bound::Text {
            text: dir.display().to_string(),
            deps: BTreeSet::from([index]),
            vars: reads.vars,
        })
    }

    /// `it<i>/<step>` (or `<step>` in setup), with `@var=value,…` for the
    /// swept variables it uses.
    fn instance_id(
        &self,
        step: &StepDef,
        iteration: Option<u32>,
        used_vars: &BTreeSet<String>,
        cell_values: &BTreeMap<String, String>,
    ) -> String {
        let tag: Vec<String> = self
            .swept
            .iter()
            .filter(|v| used_vars.contains(*v))
            .map(|v| format!("{v}={}", cell_values[v]))
            .collect();
        let id = match iteration {
            Some(i) => format!("it{i}/{}", step.name),
            None => step.name.clone(),
        };
        if tag.is_empty() {
            id
        } else {
            format!("{id}@{}", tag.join(","))
        }
    }

    /// A path field (`policy`, `teacher`, `config`) rendered, checked to be
    /// what the step it names writes (`written`).
    fn path_field(
        &self,
        step: &StepDef,
        field: &str,
        template: &Option<Template>,
        written: Option<Written>,
        ctx: &HashMap<String, Bound>,
        reads: &mut Reads,
    ) -> Result<Option<PathBuf>> {
        let Some(t) = template else {
            return Ok(None);
        };
        let r = self.required(step, field, t, ctx)?;
        if let Some(written) = written {
            let what = format!("step `{}` field `{field}`", step.name);
            self.check_declared(&r, written, t.line, &what)?;
        }
        Ok(Some(PathBuf::from(reads.take(r, true))))
    }

    /// A step's fields rendered for one instance, in the order a user
    /// reads them (so the first error is the first field's).
    fn fields(
        &self,
        step: &StepDef,
        ctx: &HashMap<String, Bound>,
        reads: &mut Reads,
    ) -> Result<Fields> {
        let mut inputs = Vec::new();
        for template in &step.inputs {
            // An input naming a step that does not run here is left out.
            if let Ok(r) = self.render(template, ctx)? {
                let what = format!("step `{}` field `inputs`", step.name);
                self.check_declared(&r, Written::Input, template.line, &what)?;
                inputs.push(PathBuf::from(reads.take(r, true)));
            }
        }
        let checkpoint = Some(Written::Checkpoint);
        let policy = self.path_field(step, "policy", &step.policy, checkpoint, ctx, reads)?;
        let mut teacher =
            self.path_field(step, "teacher", &step.teacher, checkpoint, ctx, reads)?;
        if teacher.as_deref() == Some(Path::new("self")) {
            // `--teacher self`: the policy is its own teacher, not a path.
            reads.external.retain(|p| p != Path::new("self"));
            teacher = Some(PathBuf::from("self"));
        }
        let config = self.path_field(step, "config", &step.config, None, ctx, reads)?;
        let mut sets = Vec::new();
        for set in &step.sets {
            let r = self.required(step, "set", &set.value, ctx)?;
            sets.push((set.key.clone(), reads.take(r, false), set.value.line));
        }
        for (name, key, value) in &self.overrides.step_sets {
            if name == &step.name {
                sets.push((key.clone(), value.clone(), 0));
            }
        }
        let seed = match &step.seed {
            None => None,
            Some(t) => {
                let text = reads.take(self.required(step, "seed", t, ctx)?, false);
                Some(text.trim().parse::<u64>().map_err(|_| {
                    self.err(
                        t.line,
                        format!(
                            "step `{}`: seed `{text}` is not a non-negative integer",
                            step.name
                        ),
                    )
                })?)
            }
        };
        let mut extra = Vec::new();
        for t in &step.args {
            extra.push(reads.take(self.required(step, "args", t, ctx)?, false));
        }
        let skip_if_empty = match &step.skip_if_empty {
            None => None,
            Some(t) => {
                let r = self.required(step, "skip_if_empty", t, ctx)?;
                let what = format!("step `{}` field `skip_if_empty`", step.name);
                self.check_declared(&r, Written::Table, t.line, &what)?;
                Some(PathBuf::from(reads.take(r, false)))
            }
        };
        Ok(Fields {
            inputs,
            policy,
            teacher,
            config,
            sets,
            seed,
            extra,
            skip_if_empty,
        })
    }

    /// The instances of one cell: its setup steps, then its loop.
    fn cell(&mut self, cell: &CellVars, cell_count: u64) -> Result<()> {
        let pipeline = self.pipeline;
        let mut ctx: HashMap<String, Bound> = cell
            .vars
            .iter()
            .map(|(k, v)| {
                (
                    k.clone(),
                    Bound::Text {
                        text: v.clone(),
                        deps: BTreeSet::new(),
                        vars: BTreeSet::from([k.clone()]),
                    },
                )
            })
            .collect();
        ctx.insert("out".into(), text(self.out.display().to_string()));
        for step in &pipeline.setup {
            let bound = self.add(step, None, &ctx, cell)?;
            ctx.insert(step.name.clone(), bound);
        }
        let Some(looped) = &pipeline.looped else {
            return Ok(());
        };
        let iterations = self.iterations(looped, &ctx, cell_count)?;
        let init = self.render(&looped.init_policy, &ctx)?.map_err(|why| {
            self.err(
                looped.init_policy.line,
                format!("loop `init_policy` names {why}"),
            )
        })?;
        self.check_declared(
            &init,
            Written::Checkpoint,
            looped.init_policy.line,
            "loop `init_policy`",
        )?;
        let mut policy = Bound::Text {
            text: init.text,
            deps: init.deps,
            vars: init.vars,
        };
        for i in 0..iterations {
            policy = self.iteration(looped, i, iterations, &ctx, policy, cell)?;
        }
        Ok(())
    }

    /// The loop's iteration count, bounded by [`MAX_INSTANCES`].
    fn iterations(
        &self,
        looped: &LoopDef,
        ctx: &HashMap<String, Bound>,
        cell_count: u64,
    ) -> Result<u32> {
        let n = self.render(&looped.iterations, ctx)?.map_err(|why| {
            self.err(
                looped.iterations.line,
                format!("loop `iterations` names {why}"),
            )
        })?;
        let iterations: u32 = n.text.trim().parse().map_err(|_| {
            self.err(
                looped.iterations.line,
                format!(
                    "loop `iterations` is `{}`, expected a non-negative integer",
                    n.text
                ),
            )
        })?;
        let setup_count = self.pipeline.setup.len() as u64;
        let loop_steps = looped.steps.len() as u64;
        let count = cell_count.saturating_mul(
            setup_count.saturating_add(u64::from(iterations).saturating_mul(loop_steps)),
        );
        if count > MAX_INSTANCES {
            return Err(self.err(
                looped.iterations.line,
                format!(
                    "loop `iterations` = {iterations} makes {count} step instances ({cell_count} sweep cell(s) x ({setup_count} setup steps + {iterations} iterations x {loop_steps} loop steps)); a plan has at most {MAX_INSTANCES}, each a stage run: lower `iterations`"
                ),
            ));
        }
        Ok(iterations)
    }

    /// Iteration `i` of the loop with `policy`; returns the next policy.
    fn iteration(
        &mut self,
        looped: &LoopDef,
        i: u32,
        iterations: u32,
        ctx: &HashMap<String, Bound>,
        policy: Bound,
        cell: &CellVars,
    ) -> Result<Bound> {
        let mut ictx = ctx.clone();
        ictx.insert("iter".into(), text(i.to_string()));
        ictx.insert("policy".into(), policy);
        for step in &looped.steps {
            let runs = step
                .every
                .is_none_or(|k| (i + 1) % k == 0 || i + 1 == iterations);
            let bound = if runs {
                self.add(step, Some(i), &ictx, cell)?
            } else {
                Bound::Skipped(format!(
                    "step `{}`, which does not run in iteration {i} (every = {})",
                    step.name,
                    step.every.unwrap_or(1)
                ))
            };
            ictx.insert(step.name.clone(), bound);
        }
        let next = self.render(&looped.policy, &ictx)?.map_err(|why| {
            self.err(
                looped.policy.line,
                format!("loop `policy` names {why} (iteration {i})"),
            )
        })?;
        self.check_declared(
            &next,
            Written::Checkpoint,
            looped.policy.line,
            "loop `policy`",
        )?;
        Ok(Bound::Text {
            text: next.text,
            deps: next.deps,
            vars: next.vars,
        })
    }
}

/// What a step instance reads, gathered as its fields are rendered: the
/// instances it depends on, the variables it uses, the paths from outside
/// the run.
#[derive(Default)]
struct Reads {
    deps: BTreeSet<usize>,
    vars: BTreeSet<String>,
    external: Vec<PathBuf>,
}

impl Reads {
    /// A rendered field's text; with `path`, a path that names no step is
    /// an input from outside the run.
    fn take(&mut self, r: Rendered, path: bool) -> String {
        if path && r.deps.is_empty() {
            self.external.push(PathBuf::from(&r.text));
        }
        self.deps.extend(r.deps);
        self.vars.extend(r.vars);
        r.text
    }
}

/// A step's fields rendered for one instance.
struct Fields {
    inputs: Vec<PathBuf>,
    policy: Option<PathBuf>,
    teacher: Option<PathBuf>,
    config: Option<PathBuf>,
    sets: Vec<(String, String, usize)>,
    seed: Option<u64>,
    extra: Vec<String>,
    skip_if_empty: Option<PathBuf>,
}

/// A sweep cell's variables: its index, its swept values, and every
/// variable's value in it.
struct CellVars {
    index: usize,
    values: BTreeMap<String, String>,
    vars: BTreeMap<String, String>,
}

/// The sweep's cells (one, `default`, without a sweep) and their count,
/// refused before they are expanded when they alone make more than
/// [`MAX_INSTANCES`] step instances.
fn cells(pipeline: &Pipeline) -> Result<(Vec<Cell>, u64)> {
    let cell_count = pipeline
        .sweep
        .iter()
        .fold(1u64, |n, axis| n.saturating_mul(axis.values.len() as u64));
    let setup_count = pipeline.setup.len() as u64;
    if cell_count.saturating_mul(setup_count.max(1)) > MAX_INSTANCES {
        return Err(RunnerError::Pipeline {
            file: pipeline.path.clone(),
            line: pipeline.sweep.first().map_or(0, |a| a.line),
            message: format!(
                "the sweep makes {cell_count} cells; a plan has at most {MAX_INSTANCES} step instances (each a stage run): sweep fewer values"
            ),
        });
    }
    let mut cells = vec![Cell {
        name: "default".into(),
        values: Vec::new(),
    }];
    for axis in &pipeline.sweep {
        cells = cells
            .iter()
            .flat_map(|cell| {
                axis.values.iter().map(move |value| {
                    let mut values = cell.values.clone();
                    values.push((axis.var.clone(), value.clone()));
                    Cell {
                        name: values
                            .iter()
                            .map(|(k, v)| format!("{k}={v}"))
                            .collect::<Vec<_>>()
                            .join(","),
                        values,
                    }
                })
            })
            .collect();
    }
    Ok((cells, cell_count))
}

fn text(text: impl Into<String>) -> Bound {
    Bound::Text {
        text: text.into(),
        deps: BTreeSet::new(),
        vars: BTreeSet::new(),
    }
}

impl Plan {
    /// Expands `pipeline` into instances writing under `out`.
    pub fn build(pipeline: &Pipeline, out: &Path, overrides: &Overrides) -> Result<Plan> {
        let mut defaults: BTreeMap<String, String> = pipeline
            .vars
            .iter()
            .map(|(k, (v, _))| (k.clone(), v.clone()))
            .collect();
        for (k, v) in &overrides.vars {
            defaults.insert(k.clone(), v.clone());
        }
        let (cells, cell_count) = cells(pipeline)?;
        let mut builder = Builder {
            pipeline,
            out: out.to_path_buf(),
            overrides,
            swept: pipeline.sweep.iter().map(|a| a.var.clone()).collect(),
            instances: Vec::new(),
            by_id: HashMap::new(),
        };
        for (c, cell) in cells.iter().enumerate() {
            let values: BTreeMap<String, String> = cell.values.iter().cloned().collect();
            let mut vars = defaults.clone();
            vars.extend(values.clone());
            let cell = CellVars {
                index: c,
                values,
                vars,
            };
            builder.cell(&cell, cell_count)?;
        }
        Ok(Plan {
            file: pipeline.path.clone(),
            name: pipeline.name.clone(),
            out: out.to_path_buf(),
            instances: builder.instances,
            cells,
            swept: builder.swept,
            keep_workers: pipeline.keep_workers.map_or(0, |(n, _)| n),
        })
    }

    /// The instances of step `name`, or the one instance with id `name`.
    pub fn select(&self, name: &str) -> Result<BTreeSet<usize>> {
        let found: BTreeSet<usize> = self
            .instances
            .iter()
            .enumerate()
            .filter(|(_, i)| i.step == name || i.id == name)
            .map(|(k, _)| k)
            .collect();
        if found.is_empty() {
            let mut names: Vec<&str> = self.instances.iter().map(|i| i.step.as_str()).collect();
            names.dedup();
            return Err(RunnerError::Usage(format!(
                "no step or step instance `{name}` in {}; steps: {}",
                self.file.display(),
                names.join(", ")
            )));
        }
        Ok(found)
    }
}

/// A plan of one step (generate-tasks) writing under `out`.
#[cfg(test)]
pub(crate) fn one_step(out: &Path) -> Plan {
    let text = "[[step]]\nname = \"tasks\"\nstage = \"generate-tasks\"\n";
    let pipeline = Pipeline::parse(Path::new("p.toml"), text).unwrap();
    Plan::build(&pipeline, out, &Overrides::default()).unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SWEEP: &str = r#"
[vars]
tasks = "data/train"
mode = "exact"
estimator = "grpo"
omega = 1.0

[[step]]
name = "collect"
stage = "collect-rollouts"
policy = "ckpt"
inputs = ["${tasks}"]

[[step]]
name = "score"
stage = "score-rewards"
inputs = ["${collect}", "${tasks}"]
set = { "match.mode" = "${mode}" }

[[step]]
name = "teacher"
stage = "teacher-logp"
when = "estimator == grpo_step"
inputs = ["${collect}"]
policy = "ckpt"
teacher = "self"

[[step]]
name = "adv"
stage = "compute-advantages"
inputs = ["${collect}", "${score}", "${teacher}"]
set = { estimator = "${estimator}", "step.omega" = "${omega}" }

[sweep]
mode = ["exact", "lcs"]
estimator = ["grpo", "grpo_step"]
"#;

    fn plan(text: &str, sets: &[&str]) -> Result<Plan> {
        let p = Pipeline::parse(Path::new("p.toml"), text)?;
        let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
        let overrides = Overrides::parse(&p, &sets)?;
        Plan::build(&p, Path::new("run"), &overrides)
    }

    #[test]
    fn a_sweep_shares_what_does_not_depend_on_the_varied_keys() {
        let plan = plan(SWEEP, &[]).unwrap();
        let ids: Vec<&str> = plan.instances.iter().map(|i| i.id.as_str()).collect();
        // Cells in the order of the sorted sweep keys: estimator, then mode.
        assert_eq!(plan.cells.len(), 4);
        assert_eq!(plan.cells[1].name, "estimator=grpo,mode=lcs");
        assert_eq!(
            ids,
            [
                "collect",
                "score@mode=exact",
                "adv@estimator=grpo,mode=exact",
                "score@mode=lcs",
                "adv@estimator=grpo,mode=lcs",
                "teacher@estimator=grpo_step",
                "adv@estimator=grpo_step,mode=exact",
                "adv@estimator=grpo_step,mode=lcs",
            ]
        );
        assert_eq!(
            plan.instances[0].cells,
            [0, 1, 2, 3],
            "collect runs once for all cells"
        );
        let adv = &plan.instances[6];
        assert_eq!(adv.inputs.len(), 3, "teacher joins the grpo_step cell");
        assert_eq!(
            plan.instances[2].inputs.len(),
            2,
            "the skipped teacher is left out"
        );
        assert_eq!(adv.deps, BTreeSet::from([0, 1, 5]));
        assert_eq!(
            plan.instances[0].external,
            [PathBuf::from("data/train"), PathBuf::from("ckpt")]
        );
        assert!(
            adv.stage_args().contains(&"step.omega=1.0".to_string()),
            "{:?}",
            adv.stage_args()
        );
    }

    #[test]
    fn a_renamed_variable_is_refused_with_its_new_name() {
        let text = SWEEP.replace(
            "[[step]]\nname = \"collect\"",
            "[renamed]\ntask_dir = \"tasks\"\n\n[[step]]\nname = \"collect\"",
        );
        plan(&text, &["tasks=data/pool"]).unwrap();
        let error = plan_err(&text, &["task_dir=data/pool"]);
        assert!(
            error.contains("--set `task_dir=data/pool`: variable `task_dir` was renamed `tasks`"),
            "{error}"
        );
        let mut p = Pipeline::parse(Path::new("p.toml"), &text).unwrap();
        let error = p
            .sweep_from_command_line(&["task_dir=a,b".into()])
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("variable `task_dir` was renamed `tasks`"),
            "{error}"
        );
    }

    #[test]
    fn a_pipeline_without_a_loop_may_name_a_variable_policy() {
        let text = SWEEP
            .replace("policy = \"ckpt\"", "policy = \"${policy}\"")
            .replace("[vars]\n", "[vars]\npolicy = \"ckpt\"\n");
        let plan = plan(&text, &["policy=runs/sft/policy"]).unwrap();
        assert_eq!(
            plan.instances[0].external,
            [
                PathBuf::from("data/train"),
                PathBuf::from("runs/sft/policy")
            ]
        );
    }

    #[test]
    fn sweeps_from_the_command_line_replace_or_add_axes_and_swept_sets_are_refused() {
        let mut p = Pipeline::parse(Path::new("p.toml"), SWEEP).unwrap();
        p.sweep_from_command_line(&["mode=lcs".into(), "omega=0.5, 1.0".into()])
            .unwrap();
        let plan = Plan::build(&p, Path::new("run"), &Overrides::default()).unwrap();
        let cells: Vec<&str> = plan.cells.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(
            cells,
            [
                "estimator=grpo,mode=lcs,omega=0.5",
                "estimator=grpo,mode=lcs,omega=1.0",
                "estimator=grpo_step,mode=lcs,omega=0.5",
                "estimator=grpo_step,mode=lcs,omega=1.0",
            ]
        );
        for (arg, says) in [
            ("nope=1,2", "`nope` is not a variable of this pipeline"),
            ("omega=1,", "an empty value"),
            ("omega", "expected var=value"),
        ] {
            let error = p.sweep_from_command_line(&[arg.into()]).unwrap_err();
            assert!(error.to_string().contains(says), "{arg}: {error}");
        }
        // A --set of a swept variable would be overwritten by every cell.
        let error = plan_err(SWEEP, &["estimator=gae"]);
        assert!(
            error.contains("`estimator` is swept") && error.contains("--sweep estimator=a,b"),
            "{error}"
        );
        // So is a --set of the step setting a swept variable fills in, which
        // the cells' directories would still name by the swept value.
        let error = plan_err(SWEEP, &["adv.estimator=gae"]);
        assert!(
            error.contains("`adv` sets `estimator` from the swept variable `estimator`")
                && error.contains("--sweep estimator=a,b"),
            "{error}"
        );
        // A setting the sweep does not fill in stays free.
        super::tests::plan(SWEEP, &["adv.step.omega=0.5"]).unwrap();
    }

    #[test]
    fn loops_thread_the_policy_and_honour_every() {
        let text = r#"
[vars]
n = 3
[[step]]
name = "init"
stage = "init-policy"
[loop]
iterations = "${n}"
init_policy = "${init}"
policy = "${update}/policy"
[[loop.step]]
name = "update"
stage = "update-policy"
policy = "${policy}"
set = { iteration = "${iter}" }
[[loop.step]]
name = "eval"
stage = "evaluate"
policy = "${update}/policy"
every = 2
"#;
        let plan = plan(text, &["n=4", "update.optim.lr=1e-3"]).unwrap();
        let ids: Vec<&str> = plan.instances.iter().map(|i| i.id.as_str()).collect();
        assert_eq!(
            ids,
            [
                "init",
                "it0/update",
                "it1/update",
                "it1/eval",
                "it2/update",
                "it3/update",
                "it3/eval"
            ]
        );
        assert_eq!(plan.instances[1].policy, Some(PathBuf::from("run/init")));
        assert_eq!(
            plan.instances[2].policy,
            Some(PathBuf::from("run/it0/update/policy"))
        );
        assert_eq!(plan.instances[2].deps, BTreeSet::from([1]));
        assert_eq!(
            plan.instances[2].sets,
            [
                ("iteration".to_string(), "1".to_string(), 15),
                ("optim.lr".to_string(), "1e-3".to_string(), 0)
            ]
        );
        let err = plan_err(text, &["m=1"]);
        assert!(
            err.contains("(command line): --set `m=1`") && err.contains("[n]"),
            "{err}"
        );
    }

    /// A loop of two steps over `iterations`, with `init_policy`, `policy`
    /// and the update's `inputs` as given.
    fn looped(iterations: &str, init: &str, policy: &str, inputs: &str) -> String {
        format!(
            r#"
[[step]]
name = "init"
stage = "init-policy"
[[step]]
name = "tasks"
stage = "generate-tasks"
[loop]
iterations = {iterations}
init_policy = "{init}"
policy = "{policy}"
[[loop.step]]
name = "collect"
stage = "collect-rollouts"
policy = "${{policy}}"
inputs = ["${{tasks}}"]
[[loop.step]]
name = "update"
stage = "update-policy"
policy = "${{policy}}"
inputs = {inputs}
"#
        )
    }

    #[test]
    fn a_path_a_step_does_not_write_is_an_error_at_its_line() {
        let good = looped("2", "${init}", "${update}/policy", r#"["${collect}"]"#);
        plan(&good, &[]).unwrap();
        let tables = looped(
            "2",
            "${init}",
            "${update}/policy",
            r#"["${collect}/trajectories", "${collect}/steps", "${tasks}/tasks"]"#,
        );
        plan(&tables, &[]).unwrap();
        for (text, line, says) in [
            (
                looped("2", "${init}", "${update}/polcy", r#"["${collect}"]"#),
                11,
                "loop `policy` names run/it0/update/polcy, which step `update` (update-policy) does not write (it writes metrics/ (table), policy/ (checkpoint)); expected one of its checkpoints",
            ),
            (
                // The update's metrics are a table, not a policy.
                looped("2", "${init}", "${update}/metrics", r#"["${collect}"]"#),
                11,
                "loop `policy` names run/it0/update/metrics",
            ),
            (
                // init-policy's checkpoint is its directory itself.
                looped(
                    "2",
                    "${init}/policy",
                    "${update}/policy",
                    r#"["${collect}"]"#,
                ),
                10,
                "loop `init_policy` names run/init/policy, which step `init` (init-policy) does not write (it writes its directory itself (checkpoint))",
            ),
            (
                looped(
                    "2",
                    "${init}",
                    "${update}/policy",
                    r#"["${collect}/rewards"]"#,
                ),
                21,
                "step `update` field `inputs` names run/it0/collect/rewards, which step `collect` (collect-rollouts) does not write",
            ),
        ] {
            let err = plan_err(&text, &[]);
            assert!(
                err.starts_with(&format!("p.toml:{line}: ")) && err.contains(says),
                "expected line {line}, `{says}`: {err}"
            );
        }
    }

    #[test]
    fn an_absurd_plan_is_refused_before_it_is_expanded() {
        let text = looped(
            "100000000",
            "${init}",
            "${update}/policy",
            r#"["${collect}"]"#,
        );
        let started = std::time::Instant::now();
        let err = plan_err(&text, &[]);
        assert!(
            started.elapsed() < std::time::Duration::from_secs(1),
            "{:?}",
            started.elapsed()
        );
        assert!(
            err.starts_with(
                "p.toml:9: loop `iterations` = 100000000 makes 200000002 step instances"
            ) && err.contains(&format!("a plan has at most {MAX_INSTANCES}")),
            "{err}"
        );
        // The bound counts every sweep cell.
        let swept = format!(
            "[vars]\nx = 0\n{}\n[sweep]\nx = [{}]\n",
            looped("1000", "${init}", "${update}/policy", r#"["${collect}"]"#),
            (0..100)
                .map(|v| v.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
        let err = plan_err(&swept, &[]);
        assert!(
            err.contains("makes 200200 step instances (100 sweep cell(s)"),
            "{err}"
        );
        let wide = format!(
            "[vars]\nx = 0\ny = 0\n{}\n[sweep]\nx = [{list}]\ny = [{list}]\n",
            looped("1", "${init}", "${update}/policy", r#"["${collect}"]"#),
            list = (0..400)
                .map(|v| v.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
        let err = plan_err(&wide, &[]);
        assert!(err.contains("the sweep makes 160000 cells"), "{err}");
        // Up to the bound, it plans.
        let most = (MAX_INSTANCES - 2) / 2;
        let text = looped(
            &most.to_string(),
            "${init}",
            "${update}/policy",
            r#"["${collect}"]"#,
        );
        assert_eq!(
            plan(&text, &[]).unwrap().instances.len() as u64,
            MAX_INSTANCES
        );
    }

    fn plan_err(text: &str, sets: &[&str]) -> String {
        plan(text, sets).unwrap_err().to_string()
    }

    #[test]
    fn a_field_naming_a_skipped_step_is_an_error_with_its_line() {
        let text = SWEEP.replace(
            "inputs = [\"${collect}\", \"${score}\", \"${teacher}\"]",
            "inputs = [\"${collect}\"]\npolicy = \"${teacher}\"",
        );
        let err = plan_err(&text, &[]);
        assert!(
            err.starts_with("p.toml:32:") && err.contains("does not run here"),
            "{err}"
        );
    }

    /// A setup pipeline whose pretraining steps run unless `base` names an
    /// earlier run's pretraining output, which then stands in for them.
    const INSTEAD: &str = r#"
[pipeline]
name = "t"

[vars]
base = ""

[[step]]
name = "init"
stage = "init-policy"
when = "base == "

[[step]]
name = "pretrain"
stage = "update-policy"
policy = "${init}"
when = "base == "
instead = "${base}"

[[step]]
name = "sft"
stage = "update-policy"
policy = "${pretrain}/policy"
"#;

    #[test]
    fn a_step_left_out_by_its_when_stands_for_its_instead() {
        let ran = plan(INSTEAD, &[]).unwrap();
        let ids: Vec<&str> = ran.instances.iter().map(|i| i.id.as_str()).collect();
        assert_eq!(ids, ["init", "pretrain", "sft"]);
        assert_eq!(
            ran.instances[2].policy,
            Some(PathBuf::from("run/pretrain/policy"))
        );
        assert_eq!(ran.instances[2].deps, [1].into());

        let given = plan(INSTEAD, &["base=/runs/old/pretrain"]).unwrap();
        let ids: Vec<&str> = given.instances.iter().map(|i| i.id.as_str()).collect();
        assert_eq!(ids, ["sft"], "neither init nor pretrain runs");
        let sft = &given.instances[0];
        assert_eq!(sft.policy, Some(PathBuf::from("/runs/old/pretrain/policy")));
        assert!(sft.deps.is_empty());
        assert_eq!(
            sft.external,
            [PathBuf::from("/runs/old/pretrain/policy")],
            "a path no step writes, checked to exist before any stage runs"
        );
        assert!(sft.vars.contains("base"));

        let without_when = INSTEAD.replacen("when = \"base == \"\ninstead", "instead", 1);
        let err = plan_err(&without_when, &[]);
        assert!(
            err.starts_with("p.toml:17:") && err.contains("add a `when`"),
            "{err}"
        );
    }
}
