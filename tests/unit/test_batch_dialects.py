"""The batch systems' dialects without a system: their parsers fed with recorded outputs
in the vendors' documented formats (``tests/unit/data/lsf``, ``pbs``; ``sge`` recorded from
the CI's Grid Engine 8.1.9), their state tables and the submit lines they build."""

from __future__ import annotations

from pathlib import Path

import pytest

import bellis
from bellis._launchers._base import WorkerSpec
from bellis._launchers._batch import End, Ending
from bellis._launchers._batch_text import array_ranges, hms, longest_run, parse_walltime
from bellis._launchers._lsf import lsf_ending, parse_bjobs_json
from bellis._launchers._pbs import parse_qstat_json, pbs_ending
from bellis._launchers._sge import parse_qacct, parse_qstat_xml, sge_ending

DATA = Path(__file__).parent / "data"


def _spec(**kwargs: object) -> WorkerSpec:
    return WorkerSpec(
        task_id="t", worker_id=0, env={}, payload=b"", out_path=None, err_path=None, **kwargs
    )  # type: ignore[arg-type]


# -- LSF ---------------------------------------------------------------------------------
def test_bjobs_json_rows_name_array_elements_and_skip_unknown_jobs() -> None:
    rows = parse_bjobs_json((DATA / "lsf" / "bjobs_array_and_jobs.json").read_text())
    assert rows["4711[1]"] == ("RUN", "", "")
    assert rows["4711[2]"][0] == "PEND"
    assert rows["4711[2]"][1].startswith("The job array has reached its running element limit")
    assert rows["4711[3]"] == ("DONE", "", "")
    assert rows["4712"][0] == "EXIT" and rows["4712"][2] == "130"
    assert "4716" not in rows  # "Job <4716> is not found"
    assert parse_bjobs_json((DATA / "lsf" / "bjobs_none.json").read_text()) == {}
    with pytest.raises(ValueError):
        parse_bjobs_json("[1, 2]")


def test_lsf_exit_reasons_map_to_endings() -> None:
    rows = parse_bjobs_json((DATA / "lsf" / "bjobs_array_and_jobs.json").read_text())
    ends = {job: lsf_ending(*row).end for job, row in rows.items() if row[0] in ("DONE", "EXIT")}
    assert ends == {
        "4711[3]": End.EXITED,
        "4712": End.OUT_OF_MEMORY,
        "4713": End.TIME_LIMIT,
        "4714": End.CANCELLED,
        "4715": End.EXITED,
    }
    assert lsf_ending(*rows["4715"]).code == 3
    assert lsf_ending(*rows["4711[3]"]).code == 0
    # a signal as a shell reports it (128 + n), and the reason in words only
    assert lsf_ending("EXIT", "", "137") == Ending(End.EXITED, -9, "")
    assert lsf_ending("EXIT", "job killed after reaching LSF memory usage limit", "1").end == (
        End.OUT_OF_MEMORY
    )
    assert lsf_ending("EXIT", "TERM_PREEMPT: job killed after preemption", "").end == (
        End.PREEMPTED
    )
    assert lsf_ending("EXIT", "TERM_HOST: job killed by LSF due to host failure", "").end == (
        End.NODE_FAIL
    )


def test_lsf_submit_options() -> None:
    launcher = bellis.LsfLauncher(
        queue="short", project="lab", time_limit=90, mem="4G", gpus_per_worker=1
    )
    _header, options = launcher._submission(
        "job", _spec(), [1, 2, 3, 7], "/l/o_%I.out", "/l/o_%I.err"
    )
    assert options == [
        "-J", "job[1-3,7]",
        "-n", "1", "-R", "span[hosts=1]",
        "-R", "rusage[mem=4096MB]", "-M", "4096MB",
        "-gpu", "num=1",
        "-W", "1:30",
        "-q", "short", "-P", "lab",
        "-o", "/l/o_%I.out", "-e", "/l/o_%I.err",
    ]  # fmt: skip
    capped = bellis.LsfLauncher(array_cap=5)._submission("j", _spec(), [1, 2], "o", "e")[1]
    assert capped[:2] == ["-J", "j[1-2]%5"] and capped[-4:] == ["-o", "o", "-e", "e"]
    assert bellis.LsfLauncher()._submitted_id("Job <4711> is submitted to queue <normal>.\n") == (
        "4711"
    )
    assert bellis.LsfLauncher()._element_id("4711", 3) == "4711[3]"


def test_lsf_memory_per_slot_sites_get_slots_not_limits() -> None:
    launcher = bellis.LsfLauncher(mem="40G", mem_per_slot="15G", cpus_per_worker=2)
    assert launcher.slots(_spec()) == 3  # 40G needs three 15G slots
    options = launcher._submission("j", _spec(), None, "o", "e")[1]
    assert options[options.index("-n") + 1] == "3"
    assert "-M" not in options and not any("rusage" in o for o in options)
    # a grant of the memory ladder grows the slots
    assert launcher.slots(_spec(memory=80 * 2**30)) == 6
    assert bellis.LsfLauncher(mem="4G", mem_per_slot="15G", cpus_per_worker=2).slots(_spec()) == 2


def test_lsf_255_without_project_quotes_bsub_and_names_the_fix() -> None:
    error = bellis.LsfLauncher()._submit_error(255, "Request aborted by esub. Job not submitted.")
    assert isinstance(error, bellis.WorkerStartError) and error.permanent
    assert str(error).startswith("bsub exited with code 255: Request aborted by esub.")
    assert "LsfLauncher(project=...)" in str(error)
    assert "project=" not in str(bellis.LsfLauncher(project="x")._submit_error(255, "no"))
    # another failure (a busy mbatchd) may pass on the next start
    assert not bellis.LsfLauncher()._submit_error(1, "LSF is down").permanent


# -- PBS ---------------------------------------------------------------------------------
def test_qstat_json_rows_are_subjobs_and_jobs() -> None:
    rows = parse_qstat_json((DATA / "pbs" / "qstat_array_and_jobs.json").read_text())
    assert sorted(rows) == [
        "812[0].pbs01",
        "812[1].pbs01",
        "812[2].pbs01",
        "813.pbs01",
        "814.pbs01",
        "815.pbs01",
        "816.pbs01",
    ]
    assert rows["812[0].pbs01"] == ("X", "", "0")
    assert rows["812[2].pbs01"][0] == "Q" and "Insufficient" in rows["812[2].pbs01"][1]
    assert rows["813.pbs01"][2] == "-27"
    assert rows["816.pbs01"][2] == ""
    assert parse_qstat_json("") == {}
    with pytest.raises(ValueError):
        parse_qstat_json('{"Jobs": [1]}')


@pytest.mark.parametrize(
    ("status", "tail", "end", "code"),
    [
        ("0", "", End.EXITED, 0),
        ("3", "", End.EXITED, 3),
        ("-27", "", End.OUT_OF_MEMORY, None),
        ("-26", "", End.OUT_OF_MEMORY, None),
        ("-29", "", End.TIME_LIMIT, None),
        ("-1", "", End.NOT_STARTED, None),
        ("271", "=>> PBS: job killed: walltime 65 exceeded limit 60\n", End.TIME_LIMIT, -15),
        (
            "265",
            "=>> PBS: job killed: mem 2048kb exceeded limit 1024kb",
            End.OUT_OF_MEMORY,
            -9,
        ),
        ("271", "", End.CANCELLED, -15),
        ("265", "", End.CANCELLED, -9),
        ("267", "", End.EXITED, -11),
        ("", "", End.CANCELLED, None),
    ],
)
def test_pbs_exit_statuses_map_to_endings(status: str, tail: str, end: End, code: int) -> None:
    ending = pbs_ending(status, tail)
    assert (ending.end, ending.code) == (end, code)


@pytest.mark.parametrize(
    ("script_exit", "tail", "end", "code"),
    [
        # a server without job history: the exit code the job script wrote ($?)
        ("0", "", End.EXITED, 0),
        ("3", "", End.EXITED, 3),
        ("143", "", End.CANCELLED, -15),
        ("143", "=>> PBS: job killed: walltime 65 exceeded limit 60\n", End.TIME_LIMIT, -15),
        # killed at a limit before the script could write one: MoM's note says why
        ("", "=>> PBS: job killed: mem 2048kb exceeded limit 1024kb\n", End.OUT_OF_MEMORY, -9),
        ("", "=>> PBS: job killed: walltime 65 exceeded limit 60\n", End.TIME_LIMIT, -9),
        ("", "", End.CANCELLED, None),
    ],
)
def test_pbs_endings_without_job_history(script_exit: str, tail: str, end: End, code: int) -> None:
    ending = pbs_ending("", tail, script_exit)
    assert (ending.end, ending.code) == (end, code)
    # an Exit_status, where the server keeps one, comes first
    assert pbs_ending("-27", "", script_exit).end == End.OUT_OF_MEMORY


def test_pbs_submit_options() -> None:
    launcher = bellis.PbsLauncher(
        queue="workq", account="proj1", time_limit="02:00:00", mem="4G", cpus_per_worker=4,
        gpus_per_worker=2, array_cap=3,
    )  # fmt: skip
    _h, options = launcher._submission("job", _spec(), [0, 1, 2], "/l/a.out", "/l/a.err")
    assert options == [
        "-N", "job", "-l", "select=1:ncpus=4:mem=4096mb:ngpus=2",
        "-l", "walltime=02:00:00", "-q", "workq", "-A", "proj1", "-J", "0-2%3",
        "-o", "/l/a.out", "-e", "/l/a.err", "-j", "n", "-r", "n", "-V",
    ]  # fmt: skip
    assert launcher._element_id("812[].pbs01", 4) == "812[4].pbs01"
    assert launcher._submitted_id("812[].pbs01\n") == "812[].pbs01"
    # a task's requires and a memory-ladder grant override the launcher's request
    assert launcher.select(_spec(requires={"cpus": 2, "mem": 100})) == (
        "1:ncpus=2:mem=100mb:ngpus=2"
    )
    assert launcher.select(_spec(memory=8 * 2**30)).startswith("1:ncpus=4:mem=8192mb")


# -- Grid Engine -------------------------------------------------------------------------
def test_qstat_xml_rows_expand_pending_array_tasks() -> None:
    rows = parse_qstat_xml((DATA / "sge" / "qstat_array_and_job.xml").read_text())
    assert rows["37.1"] == ("r", "", "")
    assert rows["37.2"] == rows["37.3"] == ("qw", "", "")
    assert rows["38"] == ("r", "", "")
    assert parse_qstat_xml("<job_info><queue_info/><job_info/></job_info>") == {}
    with pytest.raises(ValueError):
        parse_qstat_xml("error: commlib error")


def test_qacct_records_and_their_endings() -> None:
    two = (DATA / "sge" / "qacct_two_records.txt").read_text()
    last = parse_qacct(two, None)
    assert last is not None and last["exit_status"].split()[0] == "3"
    assert sge_ending(last, None) == Ending(End.EXITED, 3, "failed=0, exit_status=3")
    assert parse_qacct(two, 5) is None
    deleted = parse_qacct((DATA / "sge" / "qacct_qdel.txt").read_text(), None)
    assert deleted is not None
    assert sge_ending(deleted, None).end == End.CANCELLED
    h_rt = parse_qacct((DATA / "sge" / "qacct_h_rt.txt").read_text(), None)
    assert h_rt is not None and h_rt["failed"].startswith("37")
    assert sge_ending(h_rt, 30).end == End.TIME_LIMIT
    assert sge_ending(h_rt, None).end == End.TIME_LIMIT  # qmaster says so itself
    # killed (SIGKILL) when its wall clock reached h_rt: the time limit
    at_limit = {"failed": "100 : assumedly after job", "exit_status": "137", "ru_wallclock": "31s"}
    assert sge_ending(at_limit, 30).end == End.TIME_LIMIT
    assert sge_ending(at_limit, 600).end == End.CANCELLED
    assert sge_ending({"failed": "37  : qmaster enforced h_rt limit"}, 30).end == End.TIME_LIMIT
    assert sge_ending({"failed": "26  : opening input/output file"}, None).end == End.NOT_STARTED


def test_sge_submit_options_and_address_space_limit() -> None:
    launcher = bellis.SgeLauncher(mem="4G", cpus_per_worker=2, time_limit=30, array_cap=2)
    _h, options = launcher._submission("j", _spec(), [1, 2, 3], "/l/o", "/l/e")
    assert options[:3] == ["-terse", "-N", "j"]
    assert ["-pe", "smp", "2"] == options[3:6]
    assert "h_vmem=2048M" in options and "h_rt=00:30:00" in options  # per slot
    assert options[options.index("-t") + 1] == "1-3" and options[options.index("-tc") + 1] == "2"
    lines = launcher._worker_lines(_spec(), Path("/l/p"))
    assert f"export BELLIS_MEMORY_LIMIT={4 * 2**30}" in lines
    assert launcher._submitted_id("37.1-3:1\n") == "37"
    assert launcher._element_id("37", 2) == "37.2"


# -- the core's text and checks ----------------------------------------------------------
def test_array_indices() -> None:
    assert array_ranges([3, 0, 1, 2, 7, 9, 10]) == "0-3,7,9-10"
    # PBS and Grid Engine arrays are one range: the longest run of slots goes as the array
    assert longest_run([0, 1, 3, 4, 5, 9]) == [3, 4, 5]
    assert longest_run([4]) == [4] and longest_run([]) == []


def test_walltimes_and_their_errors() -> None:
    assert parse_walltime(90) == 5400
    assert parse_walltime("01:30") == 5400
    assert parse_walltime("00:00:40") == 40
    assert parse_walltime("1-00:00:00") == 86400
    assert hms(5400) == "01:30:00"
    for bad in ("soon", 0, "00:00:00"):
        with pytest.raises(bellis.ConfigurationError, match="time_limit"):
            parse_walltime(bad)


@pytest.mark.parametrize("cls", [bellis.LsfLauncher, bellis.PbsLauncher, bellis.SgeLauncher])
def test_bad_parameters_are_named(cls: type) -> None:
    with pytest.raises(bellis.ConfigurationError, match="array_cap=0"):
        cls(array_cap=0)
    with pytest.raises(bellis.ConfigurationError, match="gpus_per_worker"):
        cls(gpus_per_worker=0)
    with pytest.raises(bellis.ConfigurationError, match="max_memory"):
        cls(mem="4G", max_memory="1G")
    with pytest.raises(bellis.ConfigurationError, match="time_limit='later'"):
        cls(time_limit="later")


def test_a_fraction_of_a_gpu_is_a_whole_gpu_per_batch_job() -> None:
    # requires={"gpu": 0.5} packs workers on a GPU of this machine; a cluster job gets one
    half = _spec(requires={"gpu": 0.5})
    assert bellis.LsfLauncher().gpus(half) == 1
    assert bellis.PbsLauncher().gpus(_spec(requires={"gpu": 2})) == 2
    options = bellis.LsfLauncher()._submission("j", half, None, "o", "e")[1]
    assert options[options.index("-gpu") + 1] == "num=1"
    assert "--gres=gpu:1" in bellis.SlurmLauncher()._resource_flags(half)
