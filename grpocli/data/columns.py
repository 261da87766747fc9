"""Every row of a loaded split, checked when it loads, so that `--dry-run`, `grpo eval` and
`grpo inspect data` find what a run would otherwise meet at the step that draws the row:

- ``check_prompts``: the prompt column holds a prompt on every row: text that is not blank, or
  a non-empty list of chat messages with some content. A null (a blank CSV cell, a missing key),
  NaN, "" or [] used to stop the run at the step that drew it, with a traceback from generation
  or packing (an empty prompt has no token to start from). With ``data.template``, the columns
  it names must have a value on every row ("Solve: None" is no prompt either).
- ``mixed_type``: a column whose values are of different types (an int on some rows, a string on
  others). `datasets` stores such a column as JSON text and reads the string "1" back as the
  number 1, so what a reward receives is not what the file says; the loaders refuse it, naming
  the column, the rows and the types (grpocli.data.files for local files, grpocli.data.source for
  a loader's list of rows).

Arrow does the work for text columns (a million rows in milliseconds); other columns are read
row by row.
"""

from __future__ import annotations

import json
import math
import string
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from grpocli.errors import UserError

if TYPE_CHECKING:
    import datasets

    from grpocli.recipe.schema import DataSection

ROWS_SHOWN = 5
PROMPTS_VALID = ("text that is not blank, or a non-empty list of chat messages "
                 "[{'role': 'user', 'content': '...'}] with some content")
#: Types that one column may mix without changing a value (arrow reads 1 and 2.5 as 1.0 and 2.5).
SAME_KIND = {"int": "number", "float": "number"}


def check_prompts(dataset: datasets.Dataset, data: DataSection, source: str) -> None:
    """UserError naming the rows whose prompt is missing or empty (every row is looked at)."""
    if data.template is not None:
        _check_template_columns(dataset, data, source)
        return
    column = data.prompt_column
    if column not in dataset.column_names:
        raise UserError(
            f"rows have no prompt column {column!r}", where=f"data.prompt_column ({source})",
            valid=f"a column of the rows: {', '.join(dataset.column_names) or '(none)'}",
            hint="set data.prompt_column to one of them, or data.template = '... {column} ...'",
        )
    rows, problem = _bad_prompts(dataset, column)
    if not rows:
        return
    raise UserError(
        f"prompt column {column!r} holds no usable prompt on {len(rows)} of {len(dataset)} rows "
        f"({_rows(rows)}; rows count from 0): row {rows[0]} {problem}",
        where=f"data.prompt_column ({source}, row {rows[0]})",
        valid=PROMPTS_VALID,
        hint="fix or drop those rows (a plugin's loader: filter them out), then check with "
        "`grpo inspect data RECIPE`",
    )


def mixed_type(rows: Iterable[Mapping[str, Any]]) -> tuple[str, tuple[int, Any], tuple[int, Any]] | None:
    """The first column whose values differ in type: (column, (row, value) of its first value,
    (row, value) of the first value of another type); None when every column keeps one type.
    None values (missing) mix with anything; ints mix with floats."""
    first: dict[str, tuple[int, Any]] = {}
    for index, row in enumerate(rows):
        for column, value in row.items():
            if value is None:
                continue
            seen = first.setdefault(column, (index, value))
            if _kind(seen[1]) != _kind(value):
                return column, seen, (index, value)
    return None


def mixed_type_error(found: tuple[str, tuple[int, Any], tuple[int, Any]], where: str,
                     line_of: Mapping[int, int] | None = None) -> UserError:
    """The UserError for what ``mixed_type`` found; ``line_of`` maps rows to file lines."""
    column, (row_a, a), (row_b, b) = found
    at = {row: f"row {row}" + (f" (line {line_of[row]})" if line_of and row in line_of else "")
          for row in (row_a, row_b)}
    return UserError(
        f"column {column!r} holds {_type(a)} ({_short(a)}) on {at[row_a]} and {_type(b)} ({_short(b)}) on "
        f"{at[row_b]}; rows count from 0. `datasets` would keep such a column as JSON text and read "
        "a string such as \"1\" back as the number 1, so rewards would not get what the data says",
        where=where if not line_of or row_b not in line_of else f"{where}:{line_of[row_b]}",
        valid=f"one type per column: all {_type(a)} or all {_type(b)} (null where a row has no value)",
        hint=f"write column {column!r} the same way on every row (e.g. every value in quotes, as text), "
        "then check with `grpo inspect data RECIPE`",
    )


def _bad_prompts(dataset: datasets.Dataset, column: str) -> tuple[list[int], str]:
    """The rows without a usable prompt, and what is wrong with the first of them."""
    import pyarrow as pa
    import pyarrow.compute as pc

    values = dataset.with_format("arrow")[column]  # a ChunkedArray, in the dataset's row order
    if pa.types.is_string(values.type) or pa.types.is_large_string(values.type):
        blank = pc.equal(pc.utf8_length(pc.utf8_trim_whitespace(values)), 0)
        rows = pc.indices_nonzero(pc.fill_null(blank, True)).to_pylist()
        return rows, (_prompt_problem(values[rows[0]].as_py()) or "") if rows else ""
    decode = _decoder(dataset, column)
    problems = [(row, _prompt_problem(decode(value))) for row, value in enumerate(values.to_pylist())]
    bad = [(row, problem) for row, problem in problems if problem]
    return [row for row, _ in bad], bad[0][1] if bad else ""


def _prompt_problem(value: Any) -> str | None:
    if value is None:
        return "is empty (null: a blank CSV cell or a missing key)"
    if isinstance(value, float) and math.isnan(value):
        return "is NaN (a blank cell, read as a number)"
    if isinstance(value, str):
        return None if value.strip() else f"is blank text ({value!r})"
    if isinstance(value, list):
        if not value:
            return "is an empty list of messages"
        if not all(isinstance(m, dict) and "role" in m and "content" in m for m in value):
            return f"is a list but not chat messages ({_short(value)})"
        if not any(m.get("content") for m in value):
            return "is a list of messages that all have empty content"
        return None
    return f"holds {_type(value)} ({_short(value)})"


def _check_template_columns(dataset: datasets.Dataset, data: DataSection, source: str) -> None:
    """The columns data.template names have a value on every row (missing ones: the render says)."""
    import pyarrow.compute as pc

    try:
        fields = {name.split(".")[0].split("[")[0] for _, name, _, _ in string.Formatter().parse(data.template)
                  if name}
    except ValueError:
        return  # not a format string: rendering the first row names it
    for column in sorted(fields & set(dataset.column_names)):
        values = dataset.with_format("arrow")[column]
        if values.null_count:
            rows = pc.indices_nonzero(pc.is_null(values)).to_pylist()
            raise UserError(
                f"data.template names column {column!r}, which is empty (null) on {len(rows)} of {len(dataset)} "
                f"rows ({_rows(rows)}; rows count from 0): their prompts would read 'None'",
                where=f"data.template ({source}, row {rows[0]})", valid=f"a value of {column!r} on every row",
                hint="fill or drop those rows, then check with `grpo inspect data RECIPE`",
            )


def _decoder(dataset: datasets.Dataset, column: str) -> Any:
    """How an arrow value of ``column`` becomes the Python value a row holds (JSON columns are text)."""
    if type(dataset.features.get(column)).__name__ == "Json":
        return lambda v: None if v is None else json.loads(v)
    return lambda v: v


def _kind(value: Any) -> str:
    name = _type(value)
    return SAME_KIND.get(name, name)


def _type(value: Any) -> str:
    return type(value).__name__


def _rows(rows: list[int]) -> str:
    shown = ", ".join(map(str, rows[:ROWS_SHOWN]))
    more = f" and {len(rows) - ROWS_SHOWN} more" if len(rows) > ROWS_SHOWN else ""
    return f"row{'s' if len(rows) > 1 else ''} {shown}{more}"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
