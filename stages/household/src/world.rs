//! The world's catalog and mechanics: receptacles, objects, the fixed global
//! action list, the compact state and the step function of every skill.
//!
//! Semantics (the executor and the planners share this one step function):
//! - `find a X` moves the agent to X's *place*: a receptacle itself, the
//!   receptacle that hosts a device (Faucet → SinkBasin, DeskLamp → Desk), or
//!   the receptacle an object is in/on (objects inside closed receptacles can
//!   be found). Finding an object type goes to the first instance of that type
//!   not in the hand and not at the current place (else the first not in the
//!   hand), which is how the second of two apples gets found.
//! - `pick up the X` (hand empty) takes the first instance of X at the place
//!   whose receptacle is open (or not openable); a movable receptacle keeps its
//!   contents.
//! - `put down the object in hand` puts it into the movable receptacle found
//!   last (Bowl, Plate, ...: when the found thing is one, at this place and
//!   not itself the held object or holding movable receptacles), else into/onto
//!   the place's receptacle, which must be open if openable.
//! - `open`/`close the X` and `turn on`/`turn off the X` act on the place's
//!   receptacle or device; `slice the X` needs the Knife in hand.
//! - After every valid step: objects in the Fridge are cooled, in the
//!   Microwave while it is on are heated, in the SinkBasin while the Faucet is
//!   on are cleaned (order-independent).
//!
//! ```
//! use embodyflow_household::world::{Object, Receptacle};
//! assert_eq!(Object::Apple.as_str(), "Apple");
//! assert!(Receptacle::Fridge.openable());
//! ```

use std::collections::HashMap;
use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

macro_rules! catalog {
    ($(#[$m:meta])* $name:ident { $($v:ident),* $(,)? }) => {
        $(#[$m])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, PartialOrd, Ord, Serialize, Deserialize)]
        pub enum $name {
            $(#[doc = concat!("`", stringify!($v), "`.")] $v),*
        }
        impl $name {
            /// Every variant, in catalog order (the order of the action list).
            pub const ALL: &'static [$name] = &[$($name::$v),*];
            /// The name used in action names and observations.
            pub fn as_str(self) -> &'static str {
                match self { $($name::$v => stringify!($v)),* }
            }
            /// Looks a name up (exact spelling).
            pub fn from_name(name: &str) -> Option<$name> {
                match name { $(stringify!($v) => Some($name::$v),)* _ => None }
            }
            /// Index in [`Self::ALL`].
            pub fn index(self) -> usize {
                self as usize
            }
        }
    };
}

catalog!(
    /// A fixed receptacle of a scene.
    Receptacle {
        Fridge, Microwave, SinkBasin, StoveBurner, CounterTop, DiningTable, Cabinet,
        Drawer, Shelf, Desk, Sofa, GarbageCan, Bed, Safe,
    }
);

catalog!(
    /// A pickable object type.
    Object {
        Apple, Tomato, Potato, Bread, Egg, Lettuce, Mug, Cup, Bowl, Plate, Pan, Pot,
        Ladle, Spoon, Knife, Book, Pen, Pencil, CellPhone, KeyChain, CreditCard,
        RemoteControl, Vase, Box,
    }
);

catalog!(
    /// A toggleable appliance; Faucet and DeskLamp are devices hosted by the
    /// SinkBasin and the Desk.
    Toggle { Microwave, Faucet, DeskLamp, StoveBurner }
);

impl Receptacle {
    /// Whether it can be opened and closed (starts open or closed by seed).
    pub fn openable(self) -> bool {
        matches!(
            self,
            Receptacle::Fridge
                | Receptacle::Microwave
                | Receptacle::Cabinet
                | Receptacle::Drawer
                | Receptacle::Safe
        )
    }

    /// Words used in instructions ("dining table").
    pub fn words(self) -> &'static str {
        match self {
            Receptacle::Fridge => "fridge",
            Receptacle::Microwave => "microwave",
            Receptacle::SinkBasin => "sink",
            Receptacle::StoveBurner => "stove burner",
            Receptacle::CounterTop => "counter",
            Receptacle::DiningTable => "dining table",
            Receptacle::Cabinet => "cabinet",
            Receptacle::Drawer => "drawer",
            Receptacle::Shelf => "shelf",
            Receptacle::Desk => "desk",
            Receptacle::Sofa => "sofa",
            Receptacle::GarbageCan => "garbage can",
            Receptacle::Bed => "bed",
            Receptacle::Safe => "safe",
        }
    }

    /// "in" or "on".
    pub fn preposition(self) -> &'static str {
        match self {
            Receptacle::Fridge
            | Receptacle::Microwave
            | Receptacle::SinkBasin
            | Receptacle::Cabinet
            | Receptacle::Drawer
            | Receptacle::GarbageCan
            | Receptacle::Safe => "in",
            _ => "on",
        }
    }
}

impl Object {
    /// Whether `slice the X` applies.
    pub fn sliceable(self) -> bool {
        matches!(
            self,
            Object::Apple | Object::Tomato | Object::Potato | Object::Bread | Object::Lettuce
        )
    }

    /// Whether other objects can be put into/onto it (movable receptacle).
    pub fn movable_receptacle(self) -> bool {
        matches!(
            self,
            Object::Mug | Object::Bowl | Object::Plate | Object::Pan | Object::Pot | Object::Box
        )
    }

    /// Food (the objects that get heated, cooled and sliced).
    pub fn food(self) -> bool {
        matches!(
            self,
            Object::Apple
                | Object::Tomato
                | Object::Potato
                | Object::Bread
                | Object::Egg
                | Object::Lettuce
        )
    }

    /// Kitchenware.
    pub fn kitchenware(self) -> bool {
        matches!(
            self,
            Object::Mug
                | Object::Cup
                | Object::Bowl
                | Object::Plate
                | Object::Pan
                | Object::Pot
                | Object::Ladle
                | Object::Spoon
                | Object::Knife
        )
    }

    /// Words used in instructions ("cell phone").
    pub fn words(self) -> &'static str {
        match self {
            Object::CellPhone => "cell phone",
            Object::KeyChain => "key chain",
            Object::CreditCard => "credit card",
            Object::RemoteControl => "remote control",
            other => LOWER[other.index()],
        }
    }

    /// Plural words ("knives").
    pub fn plural(self) -> String {
        match self {
            Object::Knife => "knives".into(),
            Object::Box => "boxes".into(),
            Object::Tomato => "tomatoes".into(),
            Object::Potato => "potatoes".into(),
            Object::Bread => "loaves of bread".into(),
            Object::Lettuce => "heads of lettuce".into(),
            other => format!("{}s", other.words()),
        }
    }

    /// Whether an object of this type may be placed in/on `r` (scene layout
    /// and goal targets): the stove holds pans and pots, the bed and sofa
    /// small non-food things, the safe and garbage can no cookware.
    pub fn fits(self, r: Receptacle) -> bool {
        match r {
            Receptacle::StoveBurner => matches!(self, Object::Pan | Object::Pot),
            Receptacle::Bed | Receptacle::Sofa => !self.food() && !self.kitchenware(),
            Receptacle::Safe | Receptacle::GarbageCan => {
                !matches!(self, Object::Pan | Object::Pot | Object::Box)
            }
            Receptacle::Microwave => {
                self.food()
                    || matches!(
                        self,
                        Object::Mug | Object::Cup | Object::Bowl | Object::Plate
                    )
            }
            Receptacle::Fridge => {
                self.food()
                    || matches!(
                        self,
                        Object::Mug
                            | Object::Cup
                            | Object::Bowl
                            | Object::Plate
                            | Object::Pan
                            | Object::Pot
                    )
            }
            Receptacle::SinkBasin => self.food() || self.kitchenware(),
            _ => true,
        }
    }
}

const LOWER: [&str; 24] = [
    "apple",
    "tomato",
    "potato",
    "bread",
    "egg",
    "lettuce",
    "mug",
    "cup",
    "bowl",
    "plate",
    "pan",
    "pot",
    "ladle",
    "spoon",
    "knife",
    "book",
    "pen",
    "pencil",
    "cell phone",
    "key chain",
    "credit card",
    "remote control",
    "vase",
    "box",
];

impl Toggle {
    /// The receptacle where the agent must be to toggle it.
    pub fn host(self) -> Receptacle {
        match self {
            Toggle::Microwave => Receptacle::Microwave,
            Toggle::Faucet => Receptacle::SinkBasin,
            Toggle::DeskLamp => Receptacle::Desk,
            Toggle::StoveBurner => Receptacle::StoveBurner,
        }
    }
}

/// One entry of the global action list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Action {
    /// Index in [`action_list`].
    pub id: i32,
    /// EB-ALFRED wording, e.g. `find a Apple`.
    pub name: String,
}

/// What an action does (decoded once, by id).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Act {
    FindRec(u8),
    FindDevice(u8),
    FindObj(u8),
    Pick(u8),
    Put,
    Open(u8),
    Close(u8),
    On(u8),
    Off(u8),
    Slice(u8),
}

struct Catalog {
    actions: Vec<Action>,
    acts: Vec<Act>,
    exact: HashMap<String, i32>,
    lower: HashMap<String, i32>,
}

fn catalog() -> &'static Catalog {
    static CATALOG: OnceLock<Catalog> = OnceLock::new();
    CATALOG.get_or_init(|| {
        let mut list: Vec<(String, Act)> = Vec::new();
        for r in Receptacle::ALL {
            list.push((format!("find a {}", r.as_str()), Act::FindRec(*r as u8)));
        }
        for t in [Toggle::Faucet, Toggle::DeskLamp] {
            list.push((format!("find a {}", t.as_str()), Act::FindDevice(t as u8)));
        }
        for o in Object::ALL {
            list.push((format!("find a {}", o.as_str()), Act::FindObj(*o as u8)));
        }
        for o in Object::ALL {
            list.push((format!("pick up the {}", o.as_str()), Act::Pick(*o as u8)));
        }
        list.push(("put down the object in hand".into(), Act::Put));
        for r in Receptacle::ALL.iter().filter(|r| r.openable()) {
            list.push((format!("open the {}", r.as_str()), Act::Open(*r as u8)));
            list.push((format!("close the {}", r.as_str()), Act::Close(*r as u8)));
        }
        for t in Toggle::ALL {
            list.push((format!("turn on the {}", t.as_str()), Act::On(*t as u8)));
            list.push((format!("turn off the {}", t.as_str()), Act::Off(*t as u8)));
        }
        for o in Object::ALL.iter().filter(|o| o.sliceable()) {
            list.push((format!("slice the {}", o.as_str()), Act::Slice(*o as u8)));
        }
        let actions: Vec<Action> = list
            .iter()
            .enumerate()
            .map(|(i, (name, _))| Action {
                id: i as i32,
                name: name.clone(),
            })
            .collect();
        let exact = actions.iter().map(|a| (a.name.clone(), a.id)).collect();
        let lower = actions
            .iter()
            .map(|a| (a.name.to_lowercase(), a.id))
            .collect();
        Catalog {
            acts: list.into_iter().map(|(_, a)| a).collect(),
            actions,
            exact,
            lower,
        }
    })
}

/// The fixed global action list; `action_list()[i].id == i`.
pub fn action_list() -> &'static [Action] {
    &catalog().actions
}

/// The id of an action name: exact, else case-insensitive with surrounding
/// whitespace ignored.
pub fn action_id(name: &str) -> Option<i32> {
    let c = catalog();
    c.exact
        .get(name)
        .or_else(|| c.lower.get(&name.trim().to_lowercase()))
        .copied()
}

pub(crate) fn acts() -> &'static [Act] {
    &catalog().acts
}

/// The id of an action by its decoded meaning.
pub(crate) fn id_of(act: Act) -> i32 {
    acts()
        .iter()
        .position(|a| *a == act)
        .expect("every act is in the list") as i32
}

/// Most object instances in a scene.
pub const MAX_OBJECTS: usize = 8;
pub(crate) const NONE: u8 = 0xFF;
pub(crate) const HELD: u8 = 0xFE;
/// Locations `IN_BASE + j` mean "inside object instance j".
pub(crate) const IN_BASE: u8 = 16;

const FRIDGE: u8 = Receptacle::Fridge as u8;
const MICROWAVE: u8 = Receptacle::Microwave as u8;
const SINK: u8 = Receptacle::SinkBasin as u8;
const KNIFE: u8 = Object::Knife as u8;

const OPENABLE_MASK: u16 = (1 << Receptacle::Fridge as u16)
    | (1 << Receptacle::Microwave as u16)
    | (1 << Receptacle::Cabinet as u16)
    | (1 << Receptacle::Drawer as u16)
    | (1 << Receptacle::Safe as u16);
const MOVABLE_MASK: u32 = (1 << Object::Mug as u32)
    | (1 << Object::Bowl as u32)
    | (1 << Object::Plate as u32)
    | (1 << Object::Pan as u32)
    | (1 << Object::Pot as u32)
    | (1 << Object::Box as u32);
const SLICEABLE_MASK: u32 = (1 << Object::Apple as u32)
    | (1 << Object::Tomato as u32)
    | (1 << Object::Potato as u32)
    | (1 << Object::Bread as u32)
    | (1 << Object::Lettuce as u32);
const HOST: [u8; 4] = [
    Receptacle::Microwave as u8,
    Receptacle::SinkBasin as u8,
    Receptacle::Desk as u8,
    Receptacle::StoveBurner as u8,
];
const ON_MICROWAVE: u8 = 1 << Toggle::Microwave as u8;
const ON_FAUCET: u8 = 1 << Toggle::Faucet as u8;
pub(crate) const ON_LAMP: u8 = 1 << Toggle::DeskLamp as u8;

/// The static part of a scene: which receptacles and object instances exist.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct World {
    pub present: u16,
    pub n: u8,
    pub kind: [u8; MAX_OBJECTS],
}

/// The dynamic state: a few bytes, `Copy`, hashable (for the planners).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct State {
    pub loc: [u8; MAX_OBJECTS],
    pub heated: u8,
    pub cooled: u8,
    pub cleaned: u8,
    pub sliced: u8,
    pub open: u16,
    pub on: u8,
    pub held: u8,
    pub place: u8,
    pub focus: u8,
}

impl World {
    #[inline]
    fn has(&self, r: u8) -> bool {
        self.present & (1 << r) != 0
    }

    /// The receptacle an instance is (directly or through a movable
    /// receptacle) in, or NONE when in the hand.
    #[inline]
    pub fn top(&self, s: &State, i: usize) -> u8 {
        let l = s.loc[i];
        if l < IN_BASE {
            l
        } else if l < IN_BASE + MAX_OBJECTS as u8 {
            let c = s.loc[(l - IN_BASE) as usize];
            if c < IN_BASE { c } else { NONE }
        } else {
            NONE
        }
    }

    #[inline]
    fn reachable(&self, s: &State, i: usize) -> bool {
        let t = self.top(s, i);
        t != NONE && (OPENABLE_MASK & (1 << t) == 0 || s.open & (1 << t) != 0)
    }

    /// Applies the cooling/heating/cleaning rules.
    #[inline]
    pub fn settle(&self, s: &mut State) {
        for i in 0..self.n as usize {
            let t = self.top(s, i);
            let bit = 1u8 << i;
            if t == FRIDGE {
                s.cooled |= bit;
            } else if t == MICROWAVE && s.on & ON_MICROWAVE != 0 {
                s.heated |= bit;
            } else if t == SINK && s.on & ON_FAUCET != 0 {
                s.cleaned |= bit;
            }
        }
    }

    /// Executes one action; false (and no effect) when invalid.
    #[inline]
    pub fn step(&self, s: &mut State, act: Act) -> bool {
        let ok = match act {
            Act::FindRec(r) => {
                if self.has(r) {
                    s.place = r;
                    s.focus = NONE;
                    true
                } else {
                    false
                }
            }
            Act::FindDevice(t) => {
                let host = HOST[t as usize];
                if self.has(host) {
                    s.place = host;
                    s.focus = NONE;
                    true
                } else {
                    false
                }
            }
            Act::FindObj(k) => {
                let (mut first, mut other) = (NONE, NONE);
                for i in 0..self.n as usize {
                    if self.kind[i] != k {
                        continue;
                    }
                    let t = self.top(s, i);
                    if t == NONE {
                        continue;
                    }
                    if first == NONE {
                        first = i as u8;
                    }
                    if t != s.place && other == NONE {
                        other = i as u8;
                    }
                }
                let pick = if other != NONE { other } else { first };
                if pick == NONE {
                    false
                } else {
                    s.place = self.top(s, pick as usize);
                    s.focus = pick;
                    true
                }
            }
            Act::Pick(k) => {
                if s.held != NONE || s.place == NONE {
                    false
                } else {
                    let found = (0..self.n as usize).find(|&i| {
                        self.kind[i] == k && self.top(s, i) == s.place && self.reachable(s, i)
                    });
                    match found {
                        Some(i) => {
                            s.loc[i] = HELD;
                            s.held = i as u8;
                            true
                        }
                        None => false,
                    }
                }
            }
            Act::Put => {
                let h = s.held;
                if h == NONE || s.place == NONE {
                    false
                } else {
                    let f = s.focus;
                    let into_object = f != NONE
                        && f != h
                        && MOVABLE_MASK & (1 << self.kind[f as usize]) != 0
                        && MOVABLE_MASK & (1 << self.kind[h as usize]) == 0
                        && s.loc[f as usize] == s.place
                        && self.reachable(s, f as usize);
                    if into_object {
                        s.loc[h as usize] = IN_BASE + f;
                        s.held = NONE;
                        true
                    } else if OPENABLE_MASK & (1 << s.place) != 0 && s.open & (1 << s.place) == 0 {
                        false
                    } else {
                        s.loc[h as usize] = s.place;
                        s.held = NONE;
                        true
                    }
                }
            }
            Act::Open(r) => {
                if s.place == r && s.open & (1 << r) == 0 {
                    s.open |= 1 << r;
                    true
                } else {
                    false
                }
            }
            Act::Close(r) => {
                if s.place == r && s.open & (1 << r) != 0 {
                    s.open &= !(1 << r);
                    true
                } else {
                    false
                }
            }
            Act::On(t) => {
                if s.place == HOST[t as usize] && s.on & (1 << t) == 0 {
                    s.on |= 1 << t;
                    true
                } else {
                    false
                }
            }
            Act::Off(t) => {
                if s.place == HOST[t as usize] && s.on & (1 << t) != 0 {
                    s.on &= !(1 << t);
                    true
                } else {
                    false
                }
            }
            Act::Slice(k) => {
                if s.held == NONE
                    || self.kind[s.held as usize] != KNIFE
                    || SLICEABLE_MASK & (1 << k) == 0
                {
                    false
                } else {
                    let found = (0..self.n as usize).find(|&i| {
                        self.kind[i] == k
                            && s.sliced & (1 << i) == 0
                            && self.top(s, i) == s.place
                            && self.reachable(s, i)
                    });
                    match found {
                        Some(i) => {
                            s.sliced |= 1 << i;
                            true
                        }
                        None => false,
                    }
                }
            }
        };
        if ok {
            self.settle(s);
        }
        ok
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn action_list_is_fixed_and_ids_unique() {
        let list = action_list();
        for (i, a) in list.iter().enumerate() {
            assert_eq!(a.id, i as i32);
            assert_eq!(action_id(&a.name), Some(a.id));
        }
        let names: std::collections::HashSet<&str> = list.iter().map(|a| a.name.as_str()).collect();
        assert_eq!(names.len(), list.len());
        assert_eq!(list[0].name, "find a Fridge");
        assert_eq!(action_id("find a Apple"), Some(16));
        assert_eq!(action_id("pick up the Apple"), Some(40));
        assert_eq!(action_id("put down the object in hand"), Some(64));
        assert_eq!(action_id("open the Fridge"), Some(65));
        assert_eq!(action_id("turn on the Microwave"), Some(75));
        assert_eq!(action_id("slice the Apple"), Some(83));
        assert_eq!(list.len(), 88);
        assert_eq!(action_id("  PICK UP THE apple "), Some(40));
        assert_eq!(action_id("pick up the Unicorn"), None);
        assert_eq!(acts().len(), list.len());
        for name in [
            "turn off the Faucet",
            "close the Fridge",
            "find a DeskLamp",
            "turn on the DeskLamp",
        ] {
            assert!(action_id(name).is_some(), "{name}");
        }
    }
}
