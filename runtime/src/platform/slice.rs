//! The TPU slice this process is part of, as TPU VMs, GKE and Ray describe
//! it in the environment.
//!
//! A slice is a mesh of chips (`TPU_TOPOLOGY`, for example `2x2x2`) spread
//! over hosts: each host owns a block of `TPU_CHIPS_PER_HOST_BOUNDS` chips
//! (`2,2,1`), the hosts form a mesh of `TPU_HOST_BOUNDS` (`1,1,2`), and this
//! host is number `TPU_WORKER_ID` in it (x fastest, as TPU runtimes count).
//! `TPU_ACCELERATOR_TYPE` (`v4-16`) names the generation and the slice's
//! size (in TensorCores for two-core generations, in chips for v5e and v6e).
//! `TPU_VISIBLE_CHIPS` (`2,3`) limits this process to some of the host's
//! chips, by their index on the host. Ray sets it for an actor that holds
//! part of a host, together with `TPU_CHIPS_PER_HOST_BOUNDS=1,2,1` and
//! `TPU_HOST_BOUNDS=1,1,1`: the process then is a slice of its own, of the
//! chips it sees. `TPU_NAME` names the slice.
//!
//! [`SliceLayout::from_env`] reads these once; every platform lays out its
//! devices with the result, so an emulated multi-host slice on the host
//! platform looks to Ray and to the user exactly like a real one: each
//! process sees its visible chips, numbered from 0, each with its
//! coordinates in the whole slice. When none of the variables is set there
//! is no slice layout and nothing changes.

use super::host::{self, mesh_coords};
use crate::error::{Error, Result};

/// The variables this module reads, in the order they are documented.
pub const SLICE_ENV_VARS: [&str; 7] = [
    "TPU_NAME",
    "TPU_ACCELERATOR_TYPE",
    "TPU_TOPOLOGY",
    "TPU_CHIPS_PER_HOST_BOUNDS",
    "TPU_HOST_BOUNDS",
    "TPU_WORKER_ID",
    "TPU_VISIBLE_CHIPS",
];

/// One chip this process sees.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct SliceChip {
    /// Index of the chip on its host (what `TPU_VISIBLE_CHIPS` lists).
    pub host_chip: u32,
    /// Coordinates in the slice's mesh, as many as the topology has dimensions.
    pub coords: Vec<u32>,
}

/// Where this process sits in its slice, and which chips it sees.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct SliceLayout {
    /// `TPU_NAME`, if set.
    pub name: Option<String>,
    /// `TPU_ACCELERATOR_TYPE` as given (for example "v4-16"), if set.
    pub accelerator_type: Option<String>,
    /// The mesh of chips of the slice this process is part of.
    pub topology: Vec<u32>,
    /// Chips per host, in x, y, z.
    pub chips_per_host_bounds: [u32; 3],
    /// Hosts in the slice, in x, y, z.
    pub host_bounds: [u32; 3],
    /// This host's index among the slice's hosts.
    pub worker_id: u32,
    /// How many chips this host has (visible to this process or not).
    pub host_chips: u32,
    /// The chips this process sees, in device order.
    pub chips: Vec<SliceChip>,
}

impl SliceLayout {
    pub fn num_hosts(&self) -> u32 {
        self.host_bounds.iter().product()
    }

    /// The layout the environment describes, or `None` when it sets none
    /// of [`SLICE_ENV_VARS`]. `host_chips`: how many chips the platform's
    /// host has when it knows (the emulated host's `TPURT_HOST_CHIPS`);
    /// otherwise the accelerator type's chips per host.
    pub fn from_env(host_chips: Option<u32>) -> Result<Option<SliceLayout>> {
        Self::from_vars(
            |name| {
                std::env::var(name)
                    .ok()
                    .map(|v| v.trim().to_string())
                    .filter(|v| !v.is_empty())
            },
            host_chips,
        )
    }

    /// As [`SliceLayout::from_env`], from (name, value) pairs (tests).
    #[cfg(test)]
    pub(crate) fn from_pairs(
        vars: &[(&str, &str)],
        host_chips: Option<u32>,
    ) -> Result<Option<SliceLayout>> {
        Self::from_vars(
            |k| {
                vars.iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            },
            host_chips,
        )
    }

    /// As [`SliceLayout::from_env`], reading variables through `get`.
    pub fn from_vars(
        get: impl Fn(&str) -> Option<String>,
        host_chips: Option<u32>,
    ) -> Result<Option<SliceLayout>> {
        let name = get("TPU_NAME");
        let accelerator_type = get("TPU_ACCELERATOR_TYPE");
        let topology_var = get("TPU_TOPOLOGY");
        let cphb_var = get("TPU_CHIPS_PER_HOST_BOUNDS");
        let hb_var = get("TPU_HOST_BOUNDS");
        let worker_var = get("TPU_WORKER_ID");
        let visible_var = get("TPU_VISIBLE_CHIPS");
        if accelerator_type.is_none()
            && topology_var.is_none()
            && cphb_var.is_none()
            && hb_var.is_none()
            && worker_var.is_none()
            && visible_var.is_none()
        {
            // TPU_NAME alone says nothing about chips.
            return Ok(None);
        }

        let accel = accelerator_type
            .as_deref()
            .map(parse_accelerator_type)
            .transpose()?;
        let topology = match &topology_var {
            Some(t) => {
                let dims = parse_dims(t, 'x', "TPU_TOPOLOGY")?;
                if let Some(a) = &accel {
                    let n: u32 = dims.iter().product();
                    if n != a.chips {
                        return Err(Error::invalid(format!(
                            "TPU_TOPOLOGY={t} has {n} chips but TPU_ACCELERATOR_TYPE={} has {}",
                            a.text, a.chips
                        )));
                    }
                }
                Some(dims)
            }
            None => accel
                .as_ref()
                .map(|a| default_topology(a.chips, !a.one_core)),
        };
        let cphb = cphb_var
            .as_deref()
            .map(|v| parse_bounds(v, "TPU_CHIPS_PER_HOST_BOUNDS"))
            .transpose()?;
        let hb = hb_var
            .as_deref()
            .map(|v| parse_bounds(v, "TPU_HOST_BOUNDS"))
            .transpose()?;
        let worker_id = match &worker_var {
            Some(w) => w.parse::<u32>().map_err(|_| {
                Error::invalid(format!(
                    "TPU_WORKER_ID={w:?} is not a whole number (the host's index in its slice)"
                ))
            })?,
            None => 0,
        };
        let visible = visible_var.as_deref().map(parse_visible).transpose()?;

        // Chips per host: given, or the generation's usual host (8 chips
        // for a single-host v5e or v6e, else 4), or the whole slice when it
        // is smaller than a host.
        let per_host_default = |chips: u32, eight: bool| -> [u32; 3] {
            let host = if eight { 8 } else { 4 };
            if chips <= host {
                pad3(topology.as_deref().unwrap_or(&[chips]))
            } else {
                [2, 2, 1]
            }
        };
        let slice_chips = topology.as_ref().map(|t| t.iter().product::<u32>());
        let cphb = match (cphb, slice_chips) {
            (Some(b), _) => b,
            (None, Some(n)) => per_host_default(n, accel.as_ref().is_some_and(|a| a.one_core)),
            // Only TPU_VISIBLE_CHIPS, TPU_WORKER_ID or bounds: one host,
            // laid out as the platform's chips are (2x2 for 4).
            (None, None) => pad3(&default_topology(host_chips.unwrap_or(4), false)),
        };
        let per_host: u32 = cphb.iter().product();

        let hb = match hb {
            Some(b) => b,
            None => {
                // Without a topology the slice is this one host.
                let t = topology.as_deref().map_or(cphb, pad3);
                let mut b = [1u32; 3];
                for d in 0..3 {
                    if !t[d].is_multiple_of(cphb[d]) {
                        return Err(Error::invalid(format!(
                            "the slice's topology {} is not a whole number of hosts of {} chips \
                             (TPU_CHIPS_PER_HOST_BOUNDS); set TPU_HOST_BOUNDS",
                            join(&t, "x"),
                            join(&cphb, ",")
                        )));
                    }
                    b[d] = t[d] / cphb[d];
                }
                b
            }
        };
        let num_hosts: u32 = hb.iter().product();
        // The mesh this process is part of: the bounds describe it. When
        // they cover fewer chips than TPU_TOPOLOGY (a sub-host allocation),
        // the process is a slice of its own, and TPU_WORKER_ID (still the
        // host's number in the whole slice) places nothing.
        let mesh = [hb[0] * cphb[0], hb[1] * cphb[1], hb[2] * cphb[2]];
        let mesh_chips: u32 = mesh.iter().product();
        let own_slice = topology
            .as_ref()
            .is_some_and(|t| t.iter().product::<u32>() != mesh_chips);
        if worker_id >= num_hosts && num_hosts > 1 && !own_slice {
            return Err(Error::invalid(format!(
                "TPU_WORKER_ID={worker_id} but the slice has {num_hosts} hosts \
                 (TPU_HOST_BOUNDS {})",
                join(&hb, ",")
            )));
        }
        let topology = match topology {
            Some(t) if t.iter().product::<u32>() == mesh_chips && pad3(&t) == mesh => t,
            Some(t) if t.iter().product::<u32>() == mesh_chips => {
                return Err(Error::invalid(format!(
                    "TPU_TOPOLOGY={} does not match hosts of {} chips in a {} host mesh \
                     (TPU_CHIPS_PER_HOST_BOUNDS, TPU_HOST_BOUNDS)",
                    join(&t, "x"),
                    join(&cphb, ","),
                    join(&hb, ",")
                )));
            }
            Some(t) if cphb_var.is_none() || hb_var.is_none() => {
                return Err(Error::invalid(format!(
                    "TPU_TOPOLOGY={} has {} chips but the host bounds cover {mesh_chips}",
                    join(&t, "x"),
                    t.iter().product::<u32>()
                )));
            }
            _ => trim_mesh(mesh),
        };

        // Chips on this host: what the platform has, else the host's block.
        let host_chips = host_chips.unwrap_or_else(|| {
            let block = per_host;
            match &accel {
                // A sub-host allocation still sits on a whole host.
                Some(a) if block < a.chips_per_host() => a.chips_per_host(),
                _ => block,
            }
        });
        let visible: Vec<u32> = match visible {
            Some(v) => v,
            None => (0..per_host.min(host_chips)).collect(),
        };
        if let Some(&bad) = visible.iter().find(|&&c| c >= host_chips) {
            return Err(Error::invalid(format!(
                "TPU_VISIBLE_CHIPS names chip {bad} but this host has {host_chips} chips (0 to {})",
                host_chips - 1
            )));
        }
        if visible.len() as u32 > per_host {
            return Err(Error::invalid(format!(
                "TPU_VISIBLE_CHIPS lists {} chips but a host of this slice holds {per_host} \
                 (TPU_CHIPS_PER_HOST_BOUNDS {})",
                visible.len(),
                join(&cphb, ",")
            )));
        }
        // A process that sees the host's block in full, or part of it, keeps
        // the host's numbering; a sub-host slice (bounds set to exactly the
        // visible chips) numbers its chips in the order listed.
        let sub_host = visible.len() as u32 == per_host && per_host < host_chips;
        let host_origin = if worker_id < num_hosts && !own_slice {
            mesh_coords(worker_id, &hb)
        } else {
            vec![0; 3]
        };
        let chips = visible
            .iter()
            .enumerate()
            .map(|(i, &c)| {
                let local = mesh_coords(if sub_host { i as u32 } else { c }, &cphb);
                let mut coords: Vec<u32> = (0..3)
                    .map(|d| host_origin[d] * cphb[d] + local[d])
                    .collect();
                coords.truncate(topology.len());
                SliceChip {
                    host_chip: c,
                    coords,
                }
            })
            .collect();
        Ok(Some(SliceLayout {
            name,
            accelerator_type,
            topology,
            chips_per_host_bounds: cphb,
            host_bounds: hb,
            worker_id,
            host_chips,
            chips,
        }))
    }
}

struct Accelerator {
    text: String,
    chips: u32,
    /// v5e and v6e: one TensorCore per chip (the size counts chips), and up
    /// to 8 chips on a single host. The others: two TensorCores, 4 per host.
    one_core: bool,
}

impl Accelerator {
    /// Chips on one host of this generation: a single-host v5e or v6e has
    /// up to 8, every other host 4 (or the whole slice, when smaller).
    fn chips_per_host(&self) -> u32 {
        if self.one_core && self.chips <= 8 {
            self.chips
        } else {
            self.chips.min(4)
        }
    }
}

/// "v4-16", "v5litepod-8", "v6e-4", "tpu7x-16".
fn parse_accelerator_type(text: &str) -> Result<Accelerator> {
    let bad = || {
        Error::invalid(format!(
            "TPU_ACCELERATOR_TYPE={text:?} is not of the form GENERATION-SIZE \
             (for example v4-16, v5litepod-8, v6e-4)"
        ))
    };
    let (generation, size) = text.rsplit_once('-').ok_or_else(bad)?;
    let g = generation.to_ascii_lowercase();
    let digits = g.trim_start_matches("tpu").trim_start_matches('v');
    if !(g.starts_with('v') || g.starts_with("tpu"))
        || !digits.starts_with(|c: char| c.is_ascii_digit())
    {
        return Err(bad());
    }
    let size: u32 = size.parse().ok().filter(|&n| n > 0).ok_or_else(bad)?;
    // v5e (v5litepod) and v6e count chips, one TensorCore each; the other
    // generations count TensorCores, two per chip.
    let one_core = g.starts_with("v5litepod") || g.starts_with("v5e") || g.starts_with("v6e");
    let chips = if one_core { size } else { size / 2 };
    if chips == 0 || (!one_core && !size.is_multiple_of(2)) {
        return Err(Error::invalid(format!(
            "TPU_ACCELERATOR_TYPE={text:?}: {generation} counts TensorCores, two per chip, \
             so the size must be even"
        )));
    }
    Ok(Accelerator {
        text: text.to_string(),
        chips,
        one_core,
    })
}

fn parse_dims(text: &str, sep: char, var: &str) -> Result<Vec<u32>> {
    let dims: Option<Vec<u32>> = text
        .split(sep)
        .map(|d| d.trim().parse::<u32>().ok().filter(|&d| d > 0))
        .collect();
    match dims {
        Some(d) if !d.is_empty() && d.len() <= 3 => Ok(d),
        _ => Err(Error::invalid(format!(
            "{var}={text:?} is not 1 to 3 positive whole numbers separated by {sep:?}"
        ))),
    }
}

fn parse_bounds(text: &str, var: &str) -> Result<[u32; 3]> {
    Ok(pad3(&parse_dims(text, ',', var)?))
}

fn parse_visible(text: &str) -> Result<Vec<u32>> {
    let mut chips = Vec::new();
    for part in text.split(',') {
        let c = part.trim().parse::<u32>().map_err(|_| {
            Error::invalid(format!(
                "TPU_VISIBLE_CHIPS={text:?}: {part:?} is not a chip index (a list such as 0,1,2,3)"
            ))
        })?;
        if chips.contains(&c) {
            return Err(Error::invalid(format!(
                "TPU_VISIBLE_CHIPS={text:?} names chip {c} twice"
            )));
        }
        chips.push(c);
    }
    Ok(chips)
}

fn pad3(dims: &[u32]) -> [u32; 3] {
    let mut out = [1; 3];
    for (o, d) in out.iter_mut().zip(dims) {
        *o = *d;
    }
    out
}

/// Drop trailing dimensions of size 1 past the second: [2, 2, 1] -> [2, 2].
fn trim_mesh(mesh: [u32; 3]) -> Vec<u32> {
    let mut v = mesh.to_vec();
    while v.len() > 2 && v[v.len() - 1] == 1 {
        v.pop();
    }
    v
}

/// A slice of `chips` chips when TPU_TOPOLOGY is not set: two-core
/// generations are 3-D meshes (2x2x1, 2x2x2, 2x2x4...), the others 2-D
/// (1x1, 2x2, 2x4, 4x4...).
fn default_topology(chips: u32, three_d: bool) -> Vec<u32> {
    if three_d && chips >= 4 && chips.is_multiple_of(4) {
        return vec![2, 2, chips / 4];
    }
    host::default_topology(chips)
}

fn join(v: &[u32], sep: &str) -> String {
    v.iter().map(u32::to_string).collect::<Vec<_>>().join(sep)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(vars: &[(&str, &str)], host_chips: Option<u32>) -> Result<Option<SliceLayout>> {
        SliceLayout::from_pairs(vars, host_chips)
    }

    fn coords(l: &SliceLayout) -> Vec<Vec<u32>> {
        l.chips.iter().map(|c| c.coords.clone()).collect()
    }

    #[test]
    fn nothing_set_means_no_slice() {
        assert_eq!(layout(&[], None).unwrap(), None);
        assert_eq!(layout(&[("TPU_NAME", "x")], None).unwrap(), None);
    }

    #[test]
    fn a_v4_16_is_two_hosts_of_four_chips_along_z() {
        let vars = [
            ("TPU_NAME", "slice-a"),
            ("TPU_ACCELERATOR_TYPE", "v4-16"),
            ("TPU_TOPOLOGY", "2x2x2"),
            ("TPU_WORKER_ID", "1"),
        ];
        let l = layout(&vars, None).unwrap().unwrap();
        assert_eq!(l.topology, vec![2, 2, 2]);
        assert_eq!(l.chips_per_host_bounds, [2, 2, 1]);
        assert_eq!(l.host_bounds, [1, 1, 2]);
        assert_eq!(l.num_hosts(), 2);
        assert_eq!(l.host_chips, 4);
        assert_eq!(
            coords(&l),
            vec![vec![0, 0, 1], vec![1, 0, 1], vec![0, 1, 1], vec![1, 1, 1]]
        );
        assert_eq!(l.name.as_deref(), Some("slice-a"));
    }

    #[test]
    fn a_single_host_v6e_8_has_eight_chips_in_2x4() {
        let l = layout(
            &[("TPU_ACCELERATOR_TYPE", "v6e-8"), ("TPU_TOPOLOGY", "2x4")],
            None,
        )
        .unwrap()
        .unwrap();
        assert_eq!(l.host_chips, 8);
        assert_eq!(l.num_hosts(), 1);
        assert_eq!(l.chips.len(), 8);
        assert_eq!(l.chips[7].coords, vec![1, 3]);
    }

    #[test]
    fn visible_chips_keep_the_hosts_numbering() {
        let l = layout(
            &[
                ("TPU_ACCELERATOR_TYPE", "v4-16"),
                ("TPU_TOPOLOGY", "2x2x2"),
                ("TPU_WORKER_ID", "0"),
                ("TPU_VISIBLE_CHIPS", "3,1"),
            ],
            None,
        )
        .unwrap()
        .unwrap();
        let host: Vec<u32> = l.chips.iter().map(|c| c.host_chip).collect();
        assert_eq!(host, vec![3, 1]);
        assert_eq!(coords(&l), vec![vec![1, 1, 0], vec![1, 0, 0]]);
    }

    #[test]
    fn a_ray_sub_host_allocation_is_a_slice_of_its_own() {
        // What Ray sets for an actor holding two chips of a 4-chip host.
        let l = layout(
            &[
                ("TPU_ACCELERATOR_TYPE", "v4-8"),
                ("TPU_TOPOLOGY", "2x2x1"),
                ("TPU_VISIBLE_CHIPS", "2,3"),
                ("TPU_CHIPS_PER_HOST_BOUNDS", "1,2,1"),
                ("TPU_HOST_BOUNDS", "1,1,1"),
            ],
            None,
        )
        .unwrap()
        .unwrap();
        assert_eq!(l.topology, vec![1, 2]);
        assert_eq!(l.host_chips, 4);
        assert_eq!(coords(&l), vec![vec![0, 0], vec![0, 1]]);
        assert_eq!(l.chips[1].host_chip, 3);
    }

    #[test]
    fn a_ray_sub_host_allocation_on_a_later_host_keeps_its_worker_id() {
        // One chip of host 1 of a two-host slice: Ray sets single-host
        // bounds while TPU_WORKER_ID stays the host's number.
        let l = layout(
            &[
                ("TPU_ACCELERATOR_TYPE", "v4-16"),
                ("TPU_TOPOLOGY", "2x2x2"),
                ("TPU_WORKER_ID", "1"),
                ("TPU_VISIBLE_CHIPS", "2"),
                ("TPU_CHIPS_PER_HOST_BOUNDS", "1,1,1"),
                ("TPU_HOST_BOUNDS", "1,1,1"),
            ],
            None,
        )
        .unwrap()
        .unwrap();
        assert_eq!((l.worker_id, l.num_hosts(), l.host_chips), (1, 1, 4));
        assert_eq!(l.chips.len(), 1);
        assert_eq!(l.chips[0].host_chip, 2);
        assert_eq!(l.chips[0].coords, vec![0, 0]);
    }

    #[test]
    fn the_emulated_hosts_chip_count_bounds_visible_chips() {
        let e = layout(&[("TPU_VISIBLE_CHIPS", "0,4")], Some(4)).unwrap_err();
        assert!(e.to_string().contains("names chip 4"), "{e}");
        let l = layout(&[("TPU_VISIBLE_CHIPS", "1,2")], Some(4))
            .unwrap()
            .unwrap();
        assert_eq!(l.topology, vec![2, 2]);
        assert_eq!(coords(&l), vec![vec![1, 0], vec![0, 1]]);
    }

    #[test]
    fn bad_values_are_named() {
        let cases: [(&[(&str, &str)], &str); 7] = [
            (
                &[("TPU_ACCELERATOR_TYPE", "h100-8")],
                "TPU_ACCELERATOR_TYPE",
            ),
            (&[("TPU_ACCELERATOR_TYPE", "v4-7")], "must be even"),
            (&[("TPU_TOPOLOGY", "2xx2")], "TPU_TOPOLOGY"),
            (
                &[("TPU_ACCELERATOR_TYPE", "v4-16"), ("TPU_TOPOLOGY", "2x2")],
                "has 4 chips but TPU_ACCELERATOR_TYPE",
            ),
            (
                &[("TPU_ACCELERATOR_TYPE", "v4-16"), ("TPU_WORKER_ID", "2")],
                "TPU_WORKER_ID=2 but the slice has 2 hosts",
            ),
            (&[("TPU_WORKER_ID", "one")], "TPU_WORKER_ID"),
            (&[("TPU_VISIBLE_CHIPS", "0,0")], "twice"),
        ];
        for (vars, want) in cases {
            let e = layout(vars, None).unwrap_err().to_string();
            assert!(e.contains(want), "{vars:?}: {e}");
        }
    }

    #[test]
    fn every_chip_of_a_multi_host_slice_appears_once() {
        // 2 hosts x 4 chips as 2x4 (v5e-8 split over two 4-chip hosts).
        let mut all = Vec::new();
        for w in 0..2 {
            let w = w.to_string();
            let l = layout(
                &[
                    ("TPU_ACCELERATOR_TYPE", "v5litepod-8"),
                    ("TPU_TOPOLOGY", "2x4"),
                    ("TPU_CHIPS_PER_HOST_BOUNDS", "2,2,1"),
                    ("TPU_HOST_BOUNDS", "1,2,1"),
                    ("TPU_WORKER_ID", &w),
                ],
                None,
            )
            .unwrap()
            .unwrap();
            assert_eq!(l.num_hosts(), 2);
            all.extend(coords(&l));
        }
        all.sort();
        all.dedup();
        assert_eq!(all.len(), 8);
        assert!(all.iter().all(|c| c.len() == 2 && c[0] < 2 && c[1] < 4));
    }
}
