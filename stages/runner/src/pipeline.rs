//! Pipeline files: parsing, with a line number on everything that can be
//! wrong, and the checks that need nothing but the file and the stages'
//! declarations ([`embodyflow_core::spec`]): known stages, `shards` only
//! where a stage shards, `policy` / `teacher` where a stage loads them, known
//! names in templates, sweep keys that are variables, renamed variables
//! that are refused with their new name. The format is described in the
//! crate documentation.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use embodyflow_core::spec::{self, CheckpointFlag, Need, Sharding, StageSpec};
use serde::Deserialize;
use toml::Spanned;

use crate::backend::{RawBackend, Resources, Table, parse_mem};
use crate::error::{Result, RunnerError};

/// Names a template may use besides variables and steps.
pub const BUILTINS: &[&str] = &["iter", "policy", "out"];

/// The built-ins that exist in loop steps only (the iteration and its
/// policy): a pipeline without a `[loop]` may declare variables of these
/// names (an offline pipeline's `policy` is the checkpoint it starts from),
/// one with a loop may not, so that `${policy}` means one thing in a file.
pub const LOOP_BUILTINS: &[&str] = &["iter", "policy"];

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    pipeline: Option<RawMeta>,
    #[serde(default)]
    vars: BTreeMap<Spanned<String>, Spanned<toml::Value>>,
    #[serde(default)]
    renamed: BTreeMap<Spanned<String>, Spanned<String>>,
    #[serde(default)]
    step: Vec<Spanned<RawStep>>,
    #[serde(rename = "loop")]
    looped: Option<Spanned<RawLoop>>,
    #[serde(default)]
    sweep: BTreeMap<Spanned<String>, Spanned<Vec<toml::Value>>>,
    backend: Option<Spanned<RawBackend>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMeta {
    name: Option<String>,
    description: Option<String>,
    keep_workers: Option<Spanned<u32>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLoop {
    iterations: Spanned<toml::Value>,
    init_policy: Spanned<String>,
    policy: Spanned<String>,
    #[serde(default)]
    step: Vec<Spanned<RawStep>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStep {
    name: Spanned<String>,
    stage: Spanned<String>,
    #[serde(default)]
    inputs: Vec<Spanned<String>>,
    policy: Option<Spanned<String>>,
    teacher: Option<Spanned<String>>,
    config: Option<Spanned<String>>,
    #[serde(default)]
    set: BTreeMap<Spanned<String>, Spanned<toml::Value>>,
    seed: Option<Spanned<toml::Value>>,
    shards: Option<Spanned<u32>>,
    devices: Option<Spanned<Vec<String>>>,
    cpus: Option<Spanned<u32>>,
    mem: Option<Spanned<String>>,
    gpus: Option<Spanned<u32>>,
    every: Option<Spanned<u32>>,
    when: Option<Spanned<String>>,
    instead: Option<Spanned<String>>,
    skip_if_empty: Option<Spanned<String>>,
    #[serde(default)]
    args: Vec<Spanned<String>>,
}

/// A string that may hold `${name}` references, with its line.
#[derive(Debug, Clone, PartialEq)]
pub struct Template {
    /// The text.
    pub text: String,
    /// 1-based line in the pipeline file (0: command line).
    pub line: usize,
}

impl Template {
    /// The names referenced, in order (checked to be well formed at parse time).
    pub fn refs(&self) -> Vec<String> {
        template_refs(&self.text).unwrap_or_default()
    }
}

/// The names `${name}` in `text`, in order; an unclosed `${` is an error.
pub fn template_refs(text: &str) -> std::result::Result<Vec<String>, String> {
    let mut refs = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        let after = &rest[start + 2..];
        let end = after
            .find('}')
            .ok_or_else(|| format!("`{text}`: `${{` without a closing `}}`"))?;
        let name = after[..end].trim();
        if name.is_empty() {
            return Err(format!("`{text}`: empty `${{}}`"));
        }
        refs.push(name.to_string());
        rest = &after[end + 1..];
    }
    Ok(refs)
}

/// Replaces every `${name}` with `lookup(name)`.
pub fn render(text: &str, lookup: &mut dyn FnMut(&str) -> String) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let Some(end) = after.find('}') else {
            out.push_str(&rest[start..]);
            return out;
        };
        out.push_str(&lookup(after[..end].trim()));
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    out
}

/// One `--set` of a step.
#[derive(Debug, Clone, PartialEq)]
pub struct SetDef {
    /// Dotted key.
    pub key: String,
    /// Value (TOML text or a plain string, templated).
    pub value: Template,
}

/// A step's condition: `VAR == VALUE` or `VAR != VALUE`.
#[derive(Debug, Clone, PartialEq)]
pub struct When {
    /// The variable.
    pub var: String,
    /// True for `==`.
    pub equal: bool,
    /// The value compared with.
    pub value: String,
    /// Line.
    pub line: usize,
}

impl When {
    /// Whether the step runs with these variables.
    pub fn holds(&self, vars: &BTreeMap<String, String>) -> bool {
        let value = vars.get(&self.var).map(String::as_str).unwrap_or("");
        (value == self.value) == self.equal
    }
}

/// A step of a pipeline file.
#[derive(Debug, Clone, PartialEq)]
pub struct StepDef {
    /// Unique name.
    pub name: String,
    /// Line of the step's `name`.
    pub line: usize,
    /// The stage it runs.
    pub stage: &'static StageSpec,
    /// Line of `stage`.
    pub stage_line: usize,
    /// `--input` entries.
    pub inputs: Vec<Template>,
    /// `--policy`.
    pub policy: Option<Template>,
    /// `--teacher`.
    pub teacher: Option<Template>,
    /// `--config`.
    pub config: Option<Template>,
    /// `--set` entries, in file order (nested tables flattened to dotted keys).
    pub sets: Vec<SetDef>,
    /// `--seed`.
    pub seed: Option<Template>,
    /// Processes run at once, each with `--shard i/n`.
    pub shards: u32,
    /// Devices given to the shards in turn.
    pub devices: Vec<String>,
    /// What one of its processes asks a cluster for ([`crate::backend`]).
    pub resources: Resources,
    /// Loop steps: run in iterations where `(iter + 1) % every == 0` and in the last.
    pub every: Option<u32>,
    /// Run only when this holds.
    pub when: Option<When>,
    /// What `${name}` stands for where `when` leaves the step out: a
    /// directory holding what the step would have written (an earlier
    /// run's output of the same stage).
    pub instead: Option<Template>,
    /// Extra arguments passed as they are (templated).
    pub args: Vec<Template>,
    /// A table directory: when it has no rows, the stage is not run and the
    /// step's `policy/` links to its `--policy` (an update with nothing to
    /// learn from keeps the policy).
    pub skip_if_empty: Option<Template>,
    /// Whether it is a loop step.
    pub in_loop: bool,
}

impl StepDef {
    /// Every template of the step with the field it belongs to.
    pub fn templates(&self) -> Vec<(&'static str, &Template)> {
        let mut all: Vec<(&'static str, &Template)> = Vec::new();
        all.extend(self.inputs.iter().map(|t| ("inputs", t)));
        all.extend(self.policy.iter().map(|t| ("policy", t)));
        all.extend(self.teacher.iter().map(|t| ("teacher", t)));
        all.extend(self.config.iter().map(|t| ("config", t)));
        all.extend(self.sets.iter().map(|s| ("set", &s.value)));
        all.extend(self.seed.iter().map(|t| ("seed", t)));
        all.extend(self.args.iter().map(|t| ("args", t)));
        all.extend(self.skip_if_empty.iter().map(|t| ("skip_if_empty", t)));
        all.extend(self.instead.iter().map(|t| ("instead", t)));
        all
    }
}

/// The iteration loop.
#[derive(Debug, Clone, PartialEq)]
pub struct LoopDef {
    /// Number of iterations (templated with variables).
    pub iterations: Template,
    /// The policy of iteration 0.
    pub init_policy: Template,
    /// The policy after an iteration (names that iteration's steps).
    pub policy: Template,
    /// Steps run every iteration.
    pub steps: Vec<StepDef>,
    /// Line of `[loop]`.
    pub line: usize,
}

/// One axis of a sweep: a variable and its values.
#[derive(Debug, Clone, PartialEq)]
pub struct SweepAxis {
    /// The variable.
    pub var: String,
    /// Its values.
    pub values: Vec<String>,
    /// Line.
    pub line: usize,
}

/// A parsed and checked pipeline file.
#[derive(Debug, Clone, PartialEq)]
pub struct Pipeline {
    /// The file.
    pub path: PathBuf,
    /// Name (the file stem unless `[pipeline] name` says otherwise).
    pub name: String,
    /// Description.
    pub description: String,
    /// Variables with their default values and lines.
    pub vars: BTreeMap<String, (String, usize)>,
    /// `[renamed]`: a variable's former name, with the variable it is now
    /// (`--set`, `--sweep` and templates naming the old one are refused
    /// with the new name).
    pub renamed: BTreeMap<String, String>,
    /// Steps run once, in order.
    pub setup: Vec<StepDef>,
    /// The loop, if any.
    pub looped: Option<LoopDef>,
    /// The sweep axes, if any.
    pub sweep: Vec<SweepAxis>,
    /// Where the stage processes run (`[backend]`).
    pub backend: Table,
    /// `[pipeline] keep_workers = N`: the Gymnasium bridge workers the run
    /// keeps warm across its steps ([`crate::workers`]), with its line;
    /// none (or 0): each stage process starts its own.
    pub keep_workers: Option<(u32, usize)>,
}

/// Converts a TOML value to the text passed on a command line or substituted
/// into a template: strings as they are, everything else as TOML.
pub fn value_text(value: &toml::Value) -> String {
    match value {
        toml::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}

fn flatten_set(prefix: &str, value: &toml::Value, line: usize, out: &mut Vec<SetDef>) {
    match value {
        toml::Value::Table(table) => {
            for (key, child) in table {
                flatten_set(&format!("{prefix}.{key}"), child, line, out);
            }
        }
        other => out.push(SetDef {
            key: prefix.to_string(),
            value: Template {
                text: value_text(other),
                line,
            },
        }),
    }
}

/// The text of a pipeline file being parsed: its parts read into their
/// definitions, each error with its line.
struct Source<'a> {
    path: &'a Path,
    text: &'a str,
}

impl Source<'_> {
    fn err(&self, line: usize, message: String) -> RunnerError {
        RunnerError::Pipeline {
            file: self.path.to_path_buf(),
            line,
            message,
        }
    }

    fn line(&self, span: std::ops::Range<usize>) -> usize {
        line_of(self.text, span.start)
    }

    fn template(&self, s: &Spanned<String>) -> Template {
        Template {
            text: s.get_ref().clone(),
            line: self.line(s.span()),
        }
    }

    /// `[vars]`: names that hide no built-in, each a value (`looped`: the
    /// file has a `[loop]`, whose steps have `${iter}` and `${policy}`).
    fn vars(
        &self,
        raw: &BTreeMap<Spanned<String>, Spanned<toml::Value>>,
        looped: bool,
    ) -> Result<BTreeMap<String, (String, usize)>> {
        let mut vars = BTreeMap::new();
        for (key, value) in raw {
            let name = key.get_ref().clone();
            let l = self.line(key.span());
            if !valid_name(&name) {
                return Err(self.err(
                    l,
                    format!("variable name `{name}`: use letters, digits, `_` and `-`"),
                ));
            }
            let loop_only = LOOP_BUILTINS.contains(&name.as_str());
            if BUILTINS.contains(&name.as_str()) && (looped || !loop_only) {
                return Err(self.err(
                    l,
                    if loop_only {
                        format!(
                            "variable `{name}` would hide the built-in `${{{name}}}` of the loop's steps (a pipeline without a [loop] may declare it)"
                        )
                    } else {
                        format!("variable `{name}` would hide the built-in `${{{name}}}`")
                    },
                ));
            }
            if matches!(value.get_ref(), toml::Value::Table(_)) {
                return Err(self.err(
                    l,
                    format!("variable `{name}`: expected a value, found a table"),
                ));
            }
            vars.insert(name, (value_text(value.get_ref()), l));
        }
        Ok(vars)
    }

    /// `[renamed]`: `old = "new"`, each old name no variable and each new
    /// one a variable of `vars`.
    fn renamed(
        &self,
        raw: &BTreeMap<Spanned<String>, Spanned<String>>,
        vars: &BTreeMap<String, (String, usize)>,
    ) -> Result<BTreeMap<String, String>> {
        let mut renamed = BTreeMap::new();
        for (old, new) in raw {
            let l = self.line(old.span());
            let (old, new) = (old.get_ref(), new.get_ref());
            if vars.contains_key(old) {
                return Err(self.err(
                    l,
                    format!(
                        "[renamed] `{old}` is a variable of [vars]: a renamed name is no variable"
                    ),
                ));
            }
            if !vars.contains_key(new) {
                return Err(self.err(
                    l,
                    format!(
                        "[renamed] `{old}` = `{new}`: `{new}` is not a variable; variables: {}",
                        vars.keys().cloned().collect::<Vec<_>>().join(", ")
                    ),
                ));
            }
            renamed.insert(old.clone(), new.clone());
        }
        Ok(renamed)
    }

    /// A step (`in_loop`: of the loop).
    fn step(&self, raw: &Spanned<RawStep>, in_loop: bool) -> Result<StepDef> {
        let step = raw.get_ref();
        let mut sets = Vec::new();
        for (key, value) in &step.set {
            if key.get_ref().trim().is_empty() {
                return Err(self.err(self.line(key.span()), "empty `set` key".into()));
            }
            flatten_set(
                key.get_ref(),
                value.get_ref(),
                self.line(key.span()),
                &mut sets,
            );
        }
        let when = step.when.as_ref().map(|w| self.when(w)).transpose()?;
        let seed = step.seed.as_ref().map(|s| Template {
            text: value_text(s.get_ref()),
            line: self.line(s.span()),
        });
        let devices = step
            .devices
            .as_ref()
            .map_or_else(|| vec!["cpu".to_string()], |d| d.get_ref().clone());
        let line = |span| self.line(span);
        let resources = resources(step, &devices, &line).map_err(|(l, message)| {
            self.err(l, format!("step `{}`: {message}", step.name.get_ref()))
        })?;
        let stage_line = self.line(step.stage.span());
        let stage = spec::stage(step.stage.get_ref()).ok_or_else(|| {
            self.err(
                stage_line,
                format!(
                    "step `{}`: unknown stage `{}`; known stages: {}",
                    step.name.get_ref(),
                    step.stage.get_ref(),
                    spec::names()
                ),
            )
        })?;
        let t = |s| self.template(s);
        Ok(StepDef {
            name: step.name.get_ref().clone(),
            line: self.line(step.name.span()),
            stage,
            stage_line,
            inputs: step.inputs.iter().map(t).collect(),
            policy: step.policy.as_ref().map(t),
            teacher: step.teacher.as_ref().map(t),
            config: step.config.as_ref().map(t),
            sets,
            seed,
            shards: step.shards.as_ref().map_or(1, |s| *s.get_ref()),
            devices,
            resources,
            every: step.every.as_ref().map(|e| *e.get_ref()),
            when,
            instead: step.instead.as_ref().map(t),
            args: step.args.iter().map(t).collect(),
            skip_if_empty: step.skip_if_empty.as_ref().map(t),
            in_loop,
        })
    }

    /// A step's `when = "VAR == VALUE"` (or `!=`).
    fn when(&self, raw: &Spanned<String>) -> Result<When> {
        let l = self.line(raw.span());
        let text = raw.get_ref();
        let (var, equal, value) = if let Some((a, b)) = text.split_once("!=") {
            (a, false, b)
        } else if let Some((a, b)) = text.split_once("==") {
            (a, true, b)
        } else {
            return Err(self.err(
                l,
                format!("`when = \"{text}\"`: expected `VAR == VALUE` or `VAR != VALUE`"),
            ));
        };
        Ok(When {
            var: var.trim().to_string(),
            equal,
            value: value.trim().trim_matches('"').to_string(),
            line: l,
        })
    }

    /// `[loop]` and its steps.
    fn looped(&self, raw: &Spanned<RawLoop>) -> Result<LoopDef> {
        let inner = raw.get_ref();
        Ok(LoopDef {
            iterations: Template {
                text: value_text(inner.iterations.get_ref()),
                line: self.line(inner.iterations.span()),
            },
            init_policy: self.template(&inner.init_policy),
            policy: self.template(&inner.policy),
            steps: inner
                .step
                .iter()
                .map(|s| self.step(s, true))
                .collect::<Result<Vec<_>>>()?,
            line: self.line(raw.span()),
        })
    }

    /// `[backend]`, its per-step tables naming `steps`.
    fn backend(&self, raw: Spanned<RawBackend>, steps: &[&str]) -> Result<Table> {
        let at = self.line(raw.span());
        let line = |span| self.line(span);
        raw.into_inner()
            .check(at, &line, steps)
            .map_err(|(l, message)| self.err(l, message))
    }
}

impl Pipeline {
    /// Reads and checks a pipeline file.
    pub fn load(path: &Path) -> Result<Pipeline> {
        let text = std::fs::read_to_string(path).map_err(|e| RunnerError::Pipeline {
            file: path.to_path_buf(),
            line: 0,
            message: format!("cannot read the pipeline file: {e}"),
        })?;
        Pipeline::parse(path, &text)
    }

    /// Parses and checks pipeline text (`path` names it in messages).
    pub fn parse(path: &Path, text: &str) -> Result<Pipeline> {
        let source = Source { path, text };
        let raw: RawFile = toml::from_str(text).map_err(|e| {
            let line = e.span().map_or(1, |s| line_of(text, s.start));
            source.err(line, e.message().trim().to_string())
        })?;
        let vars = source.vars(&raw.vars, raw.looped.is_some())?;
        let renamed = source.renamed(&raw.renamed, &vars)?;
        let setup = raw
            .step
            .iter()
            .map(|s| source.step(s, false))
            .collect::<Result<Vec<_>>>()?;
        let looped = match &raw.looped {
            None => None,
            Some(l) => Some(source.looped(l)?),
        };
        let sweep = raw
            .sweep
            .iter()
            .map(|(key, values)| SweepAxis {
                var: key.get_ref().clone(),
                values: values.get_ref().iter().map(value_text).collect(),
                line: source.line(key.span()),
            })
            .collect();
        let name = raw
            .pipeline
            .as_ref()
            .and_then(|m| m.name.clone())
            .unwrap_or_else(|| {
                path.file_stem()
                    .map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or_default()
            });
        let backend = match raw.backend {
            None => Table::default(),
            Some(table) => {
                let names: Vec<&str> = setup
                    .iter()
                    .chain(looped.iter().flat_map(|l| l.steps.iter()))
                    .map(|s| s.name.as_str())
                    .collect();
                source.backend(table, &names)?
            }
        };
        let keep_workers = raw
            .pipeline
            .as_ref()
            .and_then(|m| m.keep_workers.as_ref())
            .filter(|n| *n.get_ref() > 0)
            .map(|n| (*n.get_ref(), source.line(n.span())));
        let pipeline = Pipeline {
            path: path.to_path_buf(),
            name,
            keep_workers,
            description: raw.pipeline.and_then(|m| m.description).unwrap_or_default(),
            vars,
            renamed,
            setup,
            looped,
            sweep,
            backend,
        };
        pipeline.check()?;
        Ok(pipeline)
    }

    fn err(&self, line: usize, message: String) -> RunnerError {
        RunnerError::Pipeline {
            file: self.path.clone(),
            line,
            message,
        }
    }

    /// Every step, setup first.
    pub fn steps(&self) -> impl Iterator<Item = &StepDef> {
        self.setup
            .iter()
            .chain(self.looped.iter().flat_map(|l| l.steps.iter()))
    }

    /// A step by name.
    pub fn step(&self, name: &str) -> Option<&StepDef> {
        self.steps().find(|s| s.name == name)
    }

    /// The checks that need only the file.
    fn check(&self) -> Result<()> {
        if let Some(looped) = &self.looped
            && looped.steps.is_empty()
        {
            return Err(self.err(
                looped.line,
                "`[loop]` has no steps: add `[[loop.step]]` tables (name, stage, ...) for it to run each iteration".into(),
            ));
        }
        if self.setup.is_empty() && self.looped.is_none() {
            return Err(self.err(
                1,
                "the pipeline has no steps: add a `[[step]]` table (name, stage, ...) or a `[loop]` with `[[loop.step]]` tables".into(),
            ));
        }
        let mut seen: BTreeSet<&str> = BTreeSet::new();
        for (in_loop, steps) in [(false, &self.setup)]
            .into_iter()
            .chain(self.looped.iter().map(|l| (true, &l.steps)))
        {
            for step in steps {
                self.check_name(step)?;
                self.check_stage(step)?;
                self.check_fields(step, in_loop)?;
                self.check_templates(step, in_loop, &seen)?;
                if !seen.insert(&step.name) {
                    return Err(self.err(
                        step.line,
                        format!("step name `{}` is used twice", step.name),
                    ));
                }
            }
        }
        self.check_loop()?;
        self.check_sweep()
    }

    /// The declared variables, for messages.
    fn var_list(&self) -> String {
        self.vars.keys().cloned().collect::<Vec<_>>().join(", ")
    }

    /// "variable `old` was renamed `new`" when `name` is a former name of a
    /// variable ([`Pipeline::renamed`]).
    pub fn was_renamed(&self, name: &str) -> Option<String> {
        self.renamed
            .get(name)
            .map(|new| format!("variable `{name}` was renamed `{new}`"))
    }

    /// A step's name: a valid one that is no variable or built-in.
    fn check_name(&self, step: &StepDef) -> Result<()> {
        if !valid_name(&step.name) {
            return Err(self.err(
                step.line,
                format!(
                    "step name `{}`: use letters, digits, `_` and `-`",
                    step.name
                ),
            ));
        }
        if self.vars.contains_key(&step.name) || BUILTINS.contains(&step.name.as_str()) {
            return Err(self.err(
                step.line,
                format!(
                    "step name `{}` is also a variable or built-in name; `${{{}}}` must mean one thing",
                    step.name, step.name
                ),
            ));
        }
        Ok(())
    }

    /// What the step's stage declares: `shards` only where it shards,
    /// `policy` and `teacher` where it loads them.
    fn check_stage(&self, step: &StepDef) -> Result<()> {
        if step.shards == 0 {
            return Err(self.err(
                step.line,
                format!("step `{}`: shards must be at least 1", step.name),
            ));
        }
        if let Sharding::Refused(why) = step.stage.sharding
            && step.shards > 1
        {
            let shardable: Vec<&str> = spec::STAGES
                .iter()
                .filter(|s| s.shards())
                .map(|s| s.name)
                .collect();
            return Err(self.err(
                step.stage_line,
                format!(
                    "step `{}`: stage `{}` cannot be sharded ({why}); shardable stages: {}",
                    step.name,
                    step.stage.name,
                    shardable.join(", ")
                ),
            ));
        }
        for (flag, given) in [
            (CheckpointFlag::Policy, &step.policy),
            (CheckpointFlag::Teacher, &step.teacher),
        ] {
            let field = &flag.flag()[2..];
            match (step.stage.checkpoint(flag), given) {
                (None, Some(t)) => {
                    return Err(self.err(
                        t.line,
                        format!(
                            "step `{}`: stage `{}` takes no {} (remove `{field}`)",
                            step.name,
                            step.stage.name,
                            flag.flag()
                        ),
                    ));
                }
                (Some(Need::Always), None) => {
                    return Err(self.err(
                        step.line,
                        format!(
                            "step `{}`: stage `{}` needs a {} checkpoint: add `{field} = \"…\"`",
                            step.name,
                            step.stage.name,
                            flag.flag()
                        ),
                    ));
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// `devices`, `every`, `skip_if_empty` and `when`.
    fn check_fields(&self, step: &StepDef, in_loop: bool) -> Result<()> {
        if step.devices.is_empty() {
            return Err(self.err(step.line, format!("step `{}`: empty `devices`", step.name)));
        }
        for device in &step.devices {
            if device.parse::<embodyflow_core::cli::Device>().is_err() {
                return Err(self.err(
                    step.line,
                    format!(
                        "step `{}`: device `{device}`: expected cpu, cuda or cuda:N",
                        step.name
                    ),
                ));
            }
        }
        if !in_loop && step.every.is_some() {
            return Err(self.err(
                step.line,
                format!("step `{}`: `every` applies to loop steps only", step.name),
            ));
        }
        if let Some(t) = &step.skip_if_empty
            && step.policy.is_none()
        {
            return Err(self.err(
                t.line,
                format!(
                    "step `{}`: `skip_if_empty` needs a `policy` to pass on",
                    step.name
                ),
            ));
        }
        if step.every == Some(0) {
            return Err(self.err(
                step.line,
                format!("step `{}`: `every` must be at least 1", step.name),
            ));
        }
        if let Some(t) = &step.instead
            && (step.when.is_none() || in_loop)
        {
            return Err(self.err(
                t.line,
                format!(
                    "step `{}`: `instead` stands for a setup step that its `when` leaves out: {}",
                    step.name,
                    if in_loop {
                        "not a loop step"
                    } else {
                        "add a `when`"
                    }
                ),
            ));
        }
        if let Some(when) = &step.when
            && let Some(renamed) = self.was_renamed(&when.var)
        {
            return Err(self.err(
                when.line,
                format!("step `{}`: `when`: {renamed}", step.name),
            ));
        }
        if let Some(when) = &step.when
            && !self.vars.contains_key(&when.var)
        {
            return Err(self.err(
                when.line,
                format!(
                    "step `{}`: `when` names `{}`, which is not a variable; variables: {}",
                    step.name,
                    when.var,
                    self.var_list()
                ),
            ));
        }
        Ok(())
    }

    /// The names a step's templates use: variables, the steps before it
    /// (`seen`), the built-ins.
    fn check_templates(&self, step: &StepDef, in_loop: bool, seen: &BTreeSet<&str>) -> Result<()> {
        for (field, template) in step.templates() {
            let refs = template_refs(&template.text).map_err(|m| {
                self.err(
                    template.line,
                    format!("step `{}` field `{field}`: {m}", step.name),
                )
            })?;
            for name in refs {
                let known = self.vars.contains_key(&name)
                    || seen.contains(name.as_str())
                    || (in_loop && BUILTINS.contains(&name.as_str()))
                    || name == "out";
                if let Some(renamed) = self.was_renamed(&name)
                    && !known
                {
                    return Err(self.err(
                        template.line,
                        format!("step `{}` field `{field}`: {renamed}", step.name),
                    ));
                }
                if !known {
                    let later = self.step(&name).is_some();
                    return Err(self.err(
                        template.line,
                        format!(
                            "step `{}` field `{field}`: unknown name `${{{name}}}`{}; variables: [{}], earlier steps: [{}]{}",
                            step.name,
                            if later { " (a later step: a step can only use outputs of steps before it)" } else { "" },
                            self.var_list(),
                            seen.iter().copied().collect::<Vec<_>>().join(", "),
                            if in_loop { ", built-ins: iter, policy, out" } else { ", built-in: out (iter and policy exist in loop steps only)" }
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// The names the loop's `iterations`, `init_policy` and `policy` use.
    fn check_loop(&self) -> Result<()> {
        let Some(looped) = &self.looped else {
            return Ok(());
        };
        let setup: BTreeSet<&str> = self.setup.iter().map(|s| s.name.as_str()).collect();
        let loop_names: BTreeSet<&str> = looped.steps.iter().map(|s| s.name.as_str()).collect();
        for (what, template, allowed) in [
            ("iterations", &looped.iterations, BTreeSet::new()),
            ("init_policy", &looped.init_policy, setup.clone()),
            (
                "policy",
                &looped.policy,
                setup.union(&loop_names).copied().collect(),
            ),
        ] {
            let refs = template_refs(&template.text)
                .map_err(|m| self.err(template.line, format!("loop `{what}`: {m}")))?;
            for name in refs {
                if !(self.vars.contains_key(&name)
                    || allowed.contains(name.as_str())
                    || name == "out")
                {
                    return Err(self.err(
                        template.line,
                        format!(
                            "loop `{what}`: unknown name `${{{name}}}`; variables: [{}], steps it may name: [{}]",
                            self.var_list(),
                            allowed.iter().copied().collect::<Vec<_>>().join(", ")
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Sweep keys are variables, each with values.
    fn check_sweep(&self) -> Result<()> {
        for axis in &self.sweep {
            if let Some(renamed) = self.was_renamed(&axis.var) {
                return Err(self.err(axis.line, format!("sweep key: {renamed}")));
            }
            if !self.vars.contains_key(&axis.var) {
                return Err(self.err(
                    axis.line,
                    format!(
                        "sweep key `{}` is not a variable; a sweep varies variables declared in [vars]: {}",
                        axis.var,
                        self.var_list()
                    ),
                ));
            }
            if axis.values.is_empty() {
                return Err(self.err(axis.line, format!("sweep key `{}` has no values", axis.var)));
            }
        }
        Ok(())
    }

    /// Applies `--sweep var=a,b,…` arguments: each replaces the file's axis
    /// of that variable or adds one (axes stay sorted by variable, as the
    /// file's). A variable that is not declared, or no values, is an error.
    pub fn sweep_from_command_line(&mut self, sweeps: &[String]) -> Result<()> {
        for arg in sweeps {
            let bad = |message: String| RunnerError::Pipeline {
                file: self.path.clone(),
                line: 0,
                message: format!("--sweep `{arg}`: {message}"),
            };
            let (var, values) = arg
                .split_once('=')
                .ok_or_else(|| bad("expected var=value,value,…".into()))?;
            let var = var.trim();
            if let Some(renamed) = self.was_renamed(var) {
                return Err(bad(renamed));
            }
            if !self.vars.contains_key(var) {
                let declared: Vec<&str> = self.vars.keys().map(String::as_str).collect();
                return Err(bad(format!(
                    "`{var}` is not a variable of this pipeline; variables: {}",
                    declared.join(", ")
                )));
            }
            let values: Vec<String> = values.split(',').map(|v| v.trim().to_string()).collect();
            if values.iter().any(String::is_empty) {
                return Err(bad("an empty value".into()));
            }
            self.sweep.retain(|axis| axis.var != var);
            self.sweep.push(SweepAxis {
                var: var.to_string(),
                values,
                line: 0,
            });
            self.sweep.sort_by(|a, b| a.var.cmp(&b.var));
        }
        Ok(())
    }
}

/// A step's `cpus`, `mem` and `gpus`: a CUDA step asks for one GPU unless it
/// says otherwise, and a step on the CPU for none.
fn resources(
    step: &RawStep,
    devices: &[String],
    line: &dyn Fn(std::ops::Range<usize>) -> usize,
) -> std::result::Result<Resources, (usize, String)> {
    let cuda = devices.iter().any(|d| d.starts_with("cuda"));
    let mem_mb = match &step.mem {
        None => None,
        Some(mem) => Some(parse_mem(mem.get_ref()).ok_or_else(|| {
            (
                line(mem.span()),
                format!(
                    "mem `{}`: expected a size such as 512M or 8G (MiB without a suffix)",
                    mem.get_ref()
                ),
            )
        })?),
    };
    if let Some(cpus) = &step.cpus
        && *cpus.get_ref() == 0
    {
        return Err((line(cpus.span()), "cpus must be at least 1".into()));
    }
    let gpus = match &step.gpus {
        None => u32::from(cuda),
        Some(gpus) => {
            let n = *gpus.get_ref();
            if n > 0 && !cuda {
                return Err((
                    line(gpus.span()),
                    format!(
                        "gpus = {n} on a step whose devices are {devices:?}: add `devices = [\"cuda\"]` or remove `gpus`"
                    ),
                ));
            }
            if n == 0 && cuda {
                return Err((
                    line(gpus.span()),
                    format!(
                        "gpus = 0 on a step whose devices are {devices:?}: a CUDA step needs a GPU"
                    ),
                ));
            }
            n
        }
    };
    Ok(Resources {
        cpus: step.cpus.as_ref().map(|c| *c.get_ref()),
        mem_mb,
        gpus,
    })
}

/// Names of steps and variables: letters, digits, `_`, `-`.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Pipeline> {
        Pipeline::parse(Path::new("p.toml"), text)
    }

    const GOOD: &str = r#"
[pipeline]
name = "t"

[vars]
lr = 3e-5
mode = "exact"

[[step]]
name = "tasks"
stage = "generate-tasks"
seed = 1
set = { split = "train", count = 8 }

[loop]
iterations = 2
init_policy = "${tasks}/policy"
policy = "${update}/policy"

[[loop.step]]
name = "collect"
stage = "collect-rollouts"
policy = "${policy}"
inputs = ["${tasks}"]
seed = "${iter}"
set = { iteration = "${iter}", dynamic_sampling = { enabled = true } }

[[loop.step]]
name = "update"
stage = "update-policy"
policy = "${policy}"
inputs = ["${collect}"]
set = { "optim.lr" = "${lr}" }
every = 1

[sweep]
mode = ["exact", "lcs"]
"#;

    #[test]
    fn a_good_file_parses_with_lines_and_flattened_sets() {
        let p = parse(GOOD).unwrap();
        assert_eq!(p.name, "t");
        assert_eq!(p.vars["lr"].1, 6);
        assert_eq!(p.vars["lr"].0.parse::<f64>().unwrap(), 3e-5);
        assert_eq!(p.setup[0].line, 10);
        let collect = &p.looped.as_ref().unwrap().steps[0];
        let keys: Vec<_> = collect
            .sets
            .iter()
            .map(|s| (s.key.as_str(), s.value.line))
            .collect();
        assert_eq!(keys, [("dynamic_sampling.enabled", 26), ("iteration", 26)]);
        assert_eq!(p.sweep[0].values, ["exact", "lcs"]);
    }

    #[test]
    fn mistakes_are_reported_with_their_line() {
        let cases = [
            (
                GOOD.replace(
                    "stage = \"collect-rollouts\"",
                    "stage = \"collect-rollout\"",
                ),
                22,
                "unknown stage `collect-rollout`",
            ),
            (
                GOOD.replace("inputs = [\"${collect}\"]", "inputs = [\"${colect}\"]"),
                32,
                "unknown name `${colect}`",
            ),
            (
                GOOD.replace("inputs = [\"${tasks}\"]", "inputs = [\"${update}\"]"),
                24,
                "a later step",
            ),
            (
                GOOD.replace("mode = [\"exact\"", "mood = [\"exact\""),
                37,
                "sweep key `mood` is not a variable",
            ),
            (
                GOOD.replace("seed = 1", "sede = 1"),
                12,
                "unknown field `sede`",
            ),
            (
                GOOD.replace("set = { split", "shards = 2\nset = { split")
                    .replace("generate-tasks", "init-policy"),
                11,
                "cannot be sharded",
            ),
            (
                GOOD.replace(
                    "stage = \"collect-rollouts\"\npolicy = \"${policy}\"\n",
                    "stage = \"collect-rollouts\"\n",
                ),
                21,
                "stage `collect-rollouts` needs a --policy checkpoint",
            ),
            (
                GOOD.replace("every = 1", "every = 1\nteacher = \"self\""),
                35,
                "stage `update-policy` takes no --teacher",
            ),
            (
                GOOD.replace("every = 1", "every = 1\nshards = 2"),
                30,
                "stage `update-policy` cannot be sharded (it trains one policy",
            ),
            (
                GOOD.replace("seed = 1\n", "seed = \"${iter}\"\n"),
                12,
                "iter and policy exist in loop steps only",
            ),
            (
                GOOD.replace(
                    "policy = \"${update}/policy\"",
                    "policy = \"${updat}/policy\"",
                ),
                18,
                "loop `policy`: unknown name",
            ),
        ];
        for (text, line, needle) in cases {
            let err = parse(&text).unwrap_err().to_string();
            assert!(
                err.starts_with(&format!("p.toml:{line}:")),
                "expected line {line}: {err}"
            );
            assert!(err.contains(needle), "expected `{needle}`: {err}");
        }
    }

    #[test]
    fn iter_and_policy_are_variables_only_in_a_pipeline_without_a_loop() {
        let offline = "[vars]\npolicy = \"ckpt\"\n\n[[step]]\nname = \"adv\"\nstage = \"compute-advantages\"\npolicy = \"${policy}\"\n";
        assert_eq!(parse(offline).unwrap().vars["policy"].0, "ckpt");
        for name in ["policy", "iter"] {
            let err = parse(&GOOD.replace("lr = 3e-5", &format!("{name} = 1")))
                .unwrap_err()
                .to_string();
            assert!(
                err.starts_with("p.toml:6:")
                    && err.contains(&format!("`{name}` would hide the built-in"))
                    && err.contains("without a [loop]"),
                "{err}"
            );
        }
        let err = parse(&offline.replace("policy = \"ckpt\"", "out = \"o\""))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("variable `out` would hide the built-in `${out}`"),
            "{err}"
        );
    }

    #[test]
    fn renamed_variables_name_their_new_name() {
        let with = |renamed: &str| {
            parse(&GOOD.replace(
                "[[step]]\nname = \"tasks\"",
                &format!("[renamed]\n{renamed}\n\n[[step]]\nname = \"tasks\""),
            ))
        };
        let p = with("learning_rate = \"lr\"").unwrap();
        assert_eq!(p.renamed["learning_rate"], "lr");
        assert_eq!(
            p.was_renamed("learning_rate").unwrap(),
            "variable `learning_rate` was renamed `lr`"
        );
        assert_eq!(p.was_renamed("lr"), None);
        for (renamed, needle) in [
            ("lr = \"mode\"", "`lr` is a variable of [vars]"),
            ("rate = \"rat\"", "`rat` is not a variable"),
        ] {
            let err = with(renamed).unwrap_err().to_string();
            assert!(
                err.starts_with("p.toml:10:") && err.contains(needle),
                "{err}"
            );
        }
        // The file itself naming the old name is told the new one.
        let err = parse(
            &GOOD
                .replace(
                    "[[step]]\nname = \"tasks\"",
                    "[renamed]\nrate = \"lr\"\n\n[[step]]\nname = \"tasks\"",
                )
                .replace("\"${lr}\"", "\"${rate}\""),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("variable `rate` was renamed `lr`"), "{err}");
    }

    #[test]
    fn a_pipeline_without_steps_is_an_error() {
        for text in ["", "[vars]\nlr = 1e-4\n", "[pipeline]\nname = \"empty\"\n"] {
            let err = parse(text).unwrap_err().to_string();
            assert!(
                err.starts_with("p.toml:1: the pipeline has no steps"),
                "{text:?}: {err}"
            );
        }
        let looped = "[[step]]\nname = \"tasks\"\nstage = \"generate-tasks\"\n\n[loop]\niterations = 2\ninit_policy = \"p\"\npolicy = \"p\"\n";
        let err = parse(looped).unwrap_err().to_string();
        assert!(err.starts_with("p.toml:5: `[loop]` has no steps"), "{err}");
    }

    #[test]
    fn keep_workers_is_a_count_of_workers_with_its_line() {
        let step = "[[step]]\nname = \"tasks\"\nstage = \"generate-tasks\"\n";
        let with = |head: &str| parse(&format!("[pipeline]\nname = \"k\"\n{head}\n{step}"));
        assert_eq!(with("keep_workers = 2").unwrap().keep_workers, Some((2, 3)));
        assert_eq!(with("keep_workers = 0").unwrap().keep_workers, None);
        assert_eq!(with("").unwrap().keep_workers, None);
        let err = with("keep_workers = true").unwrap_err().to_string();
        assert!(err.starts_with("p.toml:3:") && err.contains("u32"), "{err}");
    }

    #[test]
    fn templates_render_and_reject_unclosed_references() {
        let mut lookup = |n: &str| format!("<{n}>");
        assert_eq!(render("a/${x}/b${ y }", &mut lookup), "a/<x>/b<y>");
        assert_eq!(template_refs("${a}${b}").unwrap(), ["a", "b"]);
        assert!(template_refs("${a").unwrap_err().contains("closing"));
    }
}
