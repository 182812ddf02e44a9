"""The lanes' marks of straggler races still going, and the lanes file's document
(issue 39): pure, scripted tuples in, the page's JSON out."""

from __future__ import annotations

import base64
import json

import numpy as np

from bellis._report._live_lanes import lanes_document
from bellis._report._live_recent import attach_marks, driver_recent, running_marks


def test_a_race_going_marks_both_copies_running_up_to_now() -> None:
    marks = running_marks([(4, 0, 100.0, 1, 103.0)], lambda k: k + 10, 110.0)
    assert [(m["kind"], m["worker"], m["cell"], m["start"], m["end"]) for m in marks] == [
        ("straggler", "0", 14, 100.0, 110.0),
        ("backup", "1", 14, 103.0, 110.0),
    ]
    assert all(m["running"] and m["won"] is None for m in marks)


def test_marks_give_a_worker_without_a_finished_block_a_lane_and_stretch_the_window() -> None:
    recent = driver_recent([(0, 100.0, 101.0, 3, True), (0, 101.0, 102.0, 5, True)], int)
    assert recent is not None and [lane["worker"] for lane in recent["lanes"]] == ["0"]
    attach_marks(recent, running_marks([(7, 0, 101.5, 1, 104.0)], int, 108.0))
    assert [lane["worker"] for lane in recent["lanes"]] == ["0", "1"]
    assert recent["lanes"][1]["blocks"] == [] and recent["workers"] == 2
    assert recent["end"] == 108.0 and len(recent["marks"]) == 2


def test_the_lanes_document_holds_the_window_with_cells() -> None:
    blocks = [(0, 10.0, 11.5, 2, True), (1, 10.5, 12.0, 3, False)]
    doc = json.loads(lanes_document(blocks, [], [(3, 0, 9.0, 1, 11.0)], lambda k: 2 * k, 13.0))
    table = np.frombuffer(base64.b64decode(doc["blocks"]), dtype="<f8").reshape(-1, 5)
    assert table.tolist() == [[0, 10.0, 11.5, 4, 1], [1, 10.5, 12.0, 6, 0]]
    assert doc["racing"] == [[6, 0, 9.0, 1, 11.0]] and doc["races"] == []
    assert doc["format"] == 1 and doc["written"] == 13.0
