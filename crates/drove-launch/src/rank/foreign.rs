//! Which launcher started this process, read from the variables each sets:
//! drove's own (`drove run`, or a Kubernetes Indexed Job's index with
//! `DROVE_WORLD_SIZE`), torchrun and Kubeflow's PyTorchJob, OpenMPI's
//! `mpirun`, MPICH's and Intel MPI's `mpiexec` (PMI), and Slurm's `srun`.
//!
//! The rules, in order:
//!
//! 1. drove's variables win: with `DROVE_WORLD_SIZE` set, nothing else is read
//!    for the place (`drove run` gives its ranks torchrun's variables beside
//!    drove's, for PyTorch programs: they are not read, not even checked).
//! 2. The launchers that start processes (torchrun, `mpirun`, `mpiexec`)
//!    describe this process; when several set their variables they must agree
//!    (rank, world size, and local rank where both give one), else one error
//!    names every variable.
//! 3. Slurm describes it when none of those did: a task of an `srun` step
//!    (`SLURM_STEP_ID` set). A batch script itself (`sbatch`, no step) is not
//!    a task, and a process that `mpirun` started inside an allocation carries
//!    the allocation's variables, not its own place: so Slurm's variables
//!    never contradict an MPI launcher's.
//!
//! A launcher counts as present when its rank variable is set; then its world
//! size must be too (a missing piece is an error naming it), and every value
//! must be a whole number in range.

use std::fmt;

use drove_collective::Place;

use crate::error::EnvError;
use crate::var;

/// A launcher drove reads the place of a process from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Launcher {
    /// `drove run`, or drove's variables set by hand or by a manifest.
    Drove,
    /// A Kubernetes Indexed Job: `JOB_COMPLETION_INDEX` with `DROVE_WORLD_SIZE`.
    IndexedJob,
    /// torchrun or Kubeflow's PyTorchJob: `RANK`, `WORLD_SIZE`, `LOCAL_RANK`.
    Torchrun,
    /// OpenMPI's `mpirun`: `OMPI_COMM_WORLD_RANK`, `_SIZE`, `_LOCAL_RANK`.
    OpenMpi,
    /// MPICH's or Intel MPI's `mpiexec` (PMI): `PMI_RANK`, `PMI_SIZE`, `MPI_LOCALRANKID`.
    Pmi,
    /// A task of a Slurm step (`srun`): `SLURM_PROCID`, `SLURM_NTASKS`, `SLURM_LOCALID`.
    Slurm,
}

/// The variables one launcher places a process with.
#[derive(Clone, Copy, Debug)]
struct Vars {
    rank: &'static str,
    size: &'static str,
    local_rank: Option<&'static str>,
    local_size: Option<&'static str>,
}

impl Launcher {
    /// The launchers read when drove's own variables are not set, those that
    /// start processes first.
    pub const FOREIGN: [Launcher; 4] =
        [Launcher::Torchrun, Launcher::OpenMpi, Launcher::Pmi, Launcher::Slurm];

    /// Its name, as `drove check --json` reports it.
    pub fn as_str(self) -> &'static str {
        match self {
            Launcher::Drove => "drove",
            Launcher::IndexedJob => "indexed-job",
            Launcher::Torchrun => "torchrun",
            Launcher::OpenMpi => "openmpi",
            Launcher::Pmi => "pmi",
            Launcher::Slurm => "slurm",
        }
    }

    /// Whether it starts the processes it places (rather than allocating
    /// places that another launcher may fill).
    fn starts_processes(self) -> bool {
        matches!(self, Launcher::Torchrun | Launcher::OpenMpi | Launcher::Pmi)
    }

    fn vars(self) -> Vars {
        let v = |rank, size, local_rank, local_size| Vars { rank, size, local_rank, local_size };
        match self {
            Launcher::Drove => {
                v(var::RANK, var::WORLD_SIZE, Some(var::LOCAL_RANK), Some(var::LOCAL_WORLD_SIZE))
            }
            Launcher::IndexedJob => v(var::JOB_COMPLETION_INDEX, var::WORLD_SIZE, None, None),
            Launcher::Torchrun => v(
                var::TORCH_RANK,
                var::TORCH_WORLD_SIZE,
                Some(var::TORCH_LOCAL_RANK),
                Some(var::TORCH_LOCAL_WORLD_SIZE),
            ),
            Launcher::OpenMpi => v(
                "OMPI_COMM_WORLD_RANK",
                "OMPI_COMM_WORLD_SIZE",
                Some("OMPI_COMM_WORLD_LOCAL_RANK"),
                Some("OMPI_COMM_WORLD_LOCAL_SIZE"),
            ),
            Launcher::Pmi => v("PMI_RANK", "PMI_SIZE", Some("MPI_LOCALRANKID"), Some("MPI_LOCALNRANKS")),
            Launcher::Slurm => v("SLURM_PROCID", "SLURM_NTASKS", Some("SLURM_LOCALID"), None),
        }
    }
}

impl fmt::Display for Launcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

/// Where a foreign launcher placed this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ForeignPlace {
    /// The launcher.
    pub launcher: Launcher,
    /// Rank and world size.
    pub place: Place,
    /// The rank among the ranks on this host, if the launcher gives it.
    pub local_rank: Option<usize>,
    /// The number of ranks on this host, if the launcher gives it.
    pub local_world_size: Option<usize>,
}

impl ForeignPlace {
    /// The variables it was read from, e.g. `OMPI_COMM_WORLD_RANK=2, OMPI_COMM_WORLD_SIZE=3`.
    fn described(&self) -> String {
        let v = self.launcher.vars();
        let mut parts =
            vec![format!("{}={}", v.rank, self.place.rank()), format!("{}={}", v.size, self.place.world())];
        if let (Some(name), Some(local)) = (v.local_rank, self.local_rank) {
            parts.push(format!("{name}={local}"));
        }
        parts.join(", ")
    }
}

/// Reads one launcher's variables through `lookup`: `None` if its rank
/// variable is not set.
fn read(
    launcher: Launcher,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<ForeignPlace>, EnvError> {
    let v = launcher.vars();
    let get = |name: &'static str| lookup(name).filter(|s| !s.trim().is_empty());
    let number = |name: &'static str| -> Result<Option<usize>, EnvError> {
        get(name)
            .map(|s| {
                s.trim().parse().map_err(|_| EnvError::Malformed {
                    var: name,
                    value: s,
                    expected: "a whole number",
                })
            })
            .transpose()
    };
    let Some(rank) = number(v.rank)? else { return Ok(None) };
    if launcher == Launcher::Slurm && get("SLURM_STEP_ID").is_none() {
        return Ok(None); // a batch script, not a task of a step
    }
    let size = number(v.size)?.ok_or_else(|| {
        EnvError::Place(format!("{}={rank} is set but {} is not: {launcher} sets both", v.rank, v.size))
    })?;
    let place = Place::new(rank, size).map_err(|_| {
        EnvError::Place(format!(
            "{}={rank} is out of range for {}={size} (ranks are 0..{size})",
            v.rank, v.size
        ))
    })?;
    let local_rank = v.local_rank.map(number).transpose()?.flatten();
    let local_world_size = v.local_size.map(number).transpose()?.flatten();
    Ok(Some(ForeignPlace { launcher, place, local_rank, local_world_size }))
}

/// Every foreign launcher whose variables are set, in [`Launcher::FOREIGN`]
/// order (for reports: which launchers were seen).
pub fn present(lookup: &dyn Fn(&str) -> Option<String>) -> Result<Vec<ForeignPlace>, EnvError> {
    Launcher::FOREIGN.into_iter().filter_map(|l| read(l, lookup).transpose()).collect()
}

/// The place a foreign launcher gave this process, by the rules of this
/// module (drove's own variables are read elsewhere and win over these).
pub fn detect(lookup: &dyn Fn(&str) -> Option<String>) -> Result<Option<ForeignPlace>, EnvError> {
    let found = present(lookup)?;
    let starters: Vec<&ForeignPlace> = found.iter().filter(|p| p.launcher.starts_processes()).collect();
    let Some(first) = starters.first() else { return Ok(found.first().copied()) };
    let disagree = starters.iter().any(|p| {
        p.place != first.place || matches!((p.local_rank, first.local_rank), (Some(a), Some(b)) if a != b)
    });
    if disagree {
        let each: Vec<String> =
            starters.iter().map(|p| format!("{} ({})", p.launcher, p.described())).collect();
        return Err(EnvError::Place(format!(
            "the launchers' variables disagree on this process's place: {}; unset the stale ones or set DROVE_RANK and DROVE_WORLD_SIZE",
            each.join(" but ")
        )));
    }
    Ok(Some(**first))
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn detect_in(vars: &[(&str, &str)]) -> Result<Option<ForeignPlace>, EnvError> {
        let map: HashMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        detect(&|name| map.get(name).cloned())
    }

    fn placed(vars: &[(&str, &str)]) -> (Launcher, usize, usize, Option<usize>, Option<usize>) {
        let p = detect_in(vars).unwrap().expect("a launcher");
        (p.launcher, p.place.rank().get(), p.place.world().get(), p.local_rank, p.local_world_size)
    }

    #[test]
    fn each_launcher_s_variables_place_the_process() {
        let torchrun = [("RANK", "3"), ("WORLD_SIZE", "8"), ("LOCAL_RANK", "1"), ("LOCAL_WORLD_SIZE", "2")];
        assert_eq!(placed(&torchrun), (Launcher::Torchrun, 3, 8, Some(1), Some(2)));
        let ompi = [
            ("OMPI_COMM_WORLD_RANK", "2"),
            ("OMPI_COMM_WORLD_SIZE", "3"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "2"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "3"),
        ];
        assert_eq!(placed(&ompi), (Launcher::OpenMpi, 2, 3, Some(2), Some(3)));
        let pmi = [("PMI_RANK", "5"), ("PMI_SIZE", "6"), ("MPI_LOCALRANKID", "1"), ("MPI_LOCALNRANKS", "2")];
        assert_eq!(placed(&pmi), (Launcher::Pmi, 5, 6, Some(1), Some(2)));
        let slurm =
            [("SLURM_PROCID", "1"), ("SLURM_NTASKS", "4"), ("SLURM_LOCALID", "0"), ("SLURM_STEP_ID", "0")];
        assert_eq!(placed(&slurm), (Launcher::Slurm, 1, 4, Some(0), None));
        assert_eq!(detect_in(&[]).unwrap(), None, "no launcher: nothing found");
    }

    #[test]
    fn a_batch_script_is_not_a_task_and_mpi_inside_an_allocation_wins() {
        let batch = [("SLURM_PROCID", "0"), ("SLURM_NTASKS", "2"), ("SLURM_JOB_ID", "7")];
        assert_eq!(detect_in(&batch).unwrap(), None, "sbatch's script runs outside any step");
        // mpirun inside an allocation: its processes carry the daemon's Slurm task.
        let nested = [
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "1"),
            ("SLURM_STEP_ID", "0"),
            ("OMPI_COMM_WORLD_RANK", "2"),
            ("OMPI_COMM_WORLD_SIZE", "3"),
        ];
        assert_eq!(placed(&nested).0, Launcher::OpenMpi);
        // srun with PMI: both describe the same task.
        let both = [
            ("SLURM_PROCID", "1"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_STEP_ID", "0"),
            ("PMI_RANK", "1"),
            ("PMI_SIZE", "2"),
        ];
        assert_eq!(placed(&both).0, Launcher::Pmi);
    }

    #[test]
    fn launchers_that_disagree_are_one_error_naming_every_variable() {
        let e = detect_in(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "3"),
            ("OMPI_COMM_WORLD_RANK", "2"),
            ("OMPI_COMM_WORLD_SIZE", "3"),
        ])
        .unwrap_err()
        .to_string();
        assert_eq!(
            e,
            "the launchers' variables disagree on this process's place: torchrun (RANK=0, WORLD_SIZE=3) but \
             openmpi (OMPI_COMM_WORLD_RANK=2, OMPI_COMM_WORLD_SIZE=3); unset the stale ones or set DROVE_RANK and DROVE_WORLD_SIZE"
        );
        let local = detect_in(&[
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "2"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
            ("PMI_RANK", "1"),
            ("PMI_SIZE", "2"),
            ("MPI_LOCALRANKID", "0"),
        ])
        .unwrap_err()
        .to_string();
        assert!(
            local.contains("OMPI_COMM_WORLD_LOCAL_RANK=1") && local.contains("MPI_LOCALRANKID=0"),
            "{local}"
        );
    }

    #[test]
    fn a_missing_piece_or_a_malformed_value_is_named() {
        let missing = detect_in(&[("RANK", "1")]).unwrap_err().to_string();
        assert_eq!(missing, "RANK=1 is set but WORLD_SIZE is not: torchrun sets both");
        let range = detect_in(&[("PMI_RANK", "4"), ("PMI_SIZE", "4")]).unwrap_err().to_string();
        assert_eq!(range, "PMI_RANK=4 is out of range for PMI_SIZE=4 (ranks are 0..4)");
        let bad = detect_in(&[("OMPI_COMM_WORLD_RANK", "x"), ("OMPI_COMM_WORLD_SIZE", "2")])
            .unwrap_err()
            .to_string();
        assert_eq!(bad, "OMPI_COMM_WORLD_RANK=\"x\" is not a whole number");
        let local = detect_in(&[
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_STEP_ID", "3"),
            ("SLURM_LOCALID", "-1"),
        ])
        .unwrap_err()
        .to_string();
        assert_eq!(local, "SLURM_LOCALID=\"-1\" is not a whole number");
        let empty = detect_in(&[("RANK", "0"), ("WORLD_SIZE", "0")]).unwrap_err().to_string();
        assert!(empty.contains("WORLD_SIZE=0"), "{empty}");
    }
}
