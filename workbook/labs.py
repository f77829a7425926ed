"""The lab builder: ``labs/`` is generated from ``solutions/``.

A lab is written once, as a notebook with its answers in ``solutions/NN_name.ipynb``.
Inside code cells the answers sit between nbgrader's markers::

    def ring_all_reduce(tensor):
        chunks = tensor.chunk(dist.get_world_size())
        ### BEGIN SOLUTION
        # HINT: send chunk (rank - step) to the right neighbour, p - 1 times
        ...the answer...
        ### END SOLUTION
        return tensor

and the generated ``labs/NN_name.ipynb`` has, in their place, one line at the marker's
indentation::

        raise NotImplementedError("send chunk (rank - step) to the right neighbour, p - 1 times")

(the ``# HINT:`` lines of the block give the message; without one it is
"Write your solution here"). The code before and after a block is kept; a cell may have
several blocks. In markdown cells, a written answer between ``<!-- BEGIN SOLUTION -->`` and
``<!-- END SOLUTION -->`` lines becomes "*Your answer here.*".

A code cell with a solution block is an **exercise cell**; consecutive exercise cells form
one exercise, and the first code cell after them is its **check cell** (every exercise
must have one). In the lab both carry the ``raises-exception`` tag, so that
``pytest --nbval-lax labs/`` passes while the exercises are unsolved (nbval accepts an
error in such a cell and does not require one), and ``metadata["workbook"]`` =
``{"role": "exercise" | "check", "exercise": n, "title": ...}``, which
``python -m workbook.progress`` reads. Other cells must run with the exercises unsolved;
an author can tag one ``raises-exception`` in the solution when it cannot.

The lab also loses its outputs, execution counts and volatile metadata, and is the same
bytes every time it is built from the same solution, so ``--check`` can compare files::

    python -m workbook.labs            # (re)build labs/ from solutions/
    python -m workbook.labs --check    # exit 1 listing the labs that are out of date

Learners solve the labs in place, so a lab file may hold their work: cells whose sources
differ both from the lab generated now and from the lab committed in git (``HEAD``), or
outputs. Such a lab is never overwritten without ``--force`` (``make labs FORCE=1``), and
``--check`` judges its committed version instead of the learner's file.
"""

import argparse
import ast
import copy
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import nbformat
from nbconvert.preprocessors import ClearMetadataPreprocessor, ClearOutputPreprocessor

CODE_BEGIN = "### BEGIN SOLUTION"
CODE_END = "### END SOLUTION"
MARKDOWN_BEGIN = "<!-- BEGIN SOLUTION -->"
MARKDOWN_END = "<!-- END SOLUTION -->"
HINT_PREFIX = "# HINT:"
DEFAULT_HINT = "Write your solution here"
ANSWER_PLACEHOLDER = "*Your answer here.*"
RAISES_TAG = "raises-exception"
METADATA_KEY = "workbook"

# Cell metadata a lab keeps; everything else (execution timings, scroll state, ...) goes.
KEPT_CELL_METADATA = {"tags", METADATA_KEY, "editable", "deletable", "jupyter", "slideshow"}
KEPT_NOTEBOOK_METADATA = {"kernelspec", METADATA_KEY, ("language_info", "name")}


class LabError(ValueError):
    """A solution notebook whose markers do not make a valid lab."""


def strip_code(source, where="cell"):
    """Replace each solution block of a code cell's source by ``raise NotImplementedError``.

    Returns ``(new_source, number_of_blocks)``. ``where`` names the cell in error messages.
    """
    return _strip(source, CODE_BEGIN, CODE_END, where, _code_stub)


def strip_markdown(source, where="cell"):
    """Replace each written answer of a markdown cell by "*Your answer here.*"."""
    return _strip(source, MARKDOWN_BEGIN, MARKDOWN_END, where,
                  lambda indent, block: indent + ANSWER_PLACEHOLDER)


def _code_stub(indent, block):
    hints = [line.strip()[len(HINT_PREFIX):].strip() for line in block
             if line.strip().startswith(HINT_PREFIX)]
    hint = " ".join(h for h in hints if h) or DEFAULT_HINT
    # A JSON string is a valid Python string literal, and always in double quotes.
    return f"{indent}raise NotImplementedError({json.dumps(hint, ensure_ascii=False)})"


def _strip(source, begin, end, where, stub):
    out, block, indent, count = [], None, "", 0
    for number, line in enumerate(source.split("\n"), 1):
        text = line.strip()
        if text == begin:
            if block is not None:
                raise LabError(f"{where}, line {number}: {begin!r} inside another solution "
                               f"block (a block ends with {end!r})")
            block, indent = [], line[:len(line) - len(line.lstrip())]
        elif text == end:
            if block is None:
                raise LabError(f"{where}, line {number}: {end!r} without {begin!r} before it")
            out.append(stub(indent, block))
            block, count = None, count + 1
        elif "BEGIN SOLUTION" in text or "END SOLUTION" in text:
            # A misspelt marker would leave the answer in the lab: refuse it.
            raise LabError(f"{where}, line {number}: {text!r} looks like a solution marker; "
                           f"write it exactly {begin!r} / {end!r} on a line of its own")
        elif block is not None:
            block.append(line)
        else:
            out.append(line)
    if block is not None:
        raise LabError(f"{where}: {begin!r} is never closed by {end!r}")
    return "\n".join(out), count


def _check_syntax(source, where):
    """Fail on a lab cell that is not valid Python, e.g. from a marker's wrong indentation."""
    from IPython.core.inputtransformer2 import TransformerManager  # magics, !shell lines
    try:
        compile(TransformerManager().transform_cell(source), where, "exec",
                flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT, dont_inherit=True)
    except SyntaxError as error:
        raise LabError(f"{where}: the lab's code is not valid Python ({error.msg}, line "
                       f"{error.lineno}); check the indentation of the solution markers:\n"
                       f"{source}") from None


def _heading(markdown):
    for line in markdown.split("\n"):
        if line.startswith("#"):
            return line.lstrip("#").strip()
    return None


def make_lab(solution, name="solution"):
    """Return the lab notebook for a solution notebook (which is left unchanged).

    ``name`` (e.g. the file name) is used in error messages and the lab's metadata.
    """
    lab = copy.deepcopy(solution)
    _give_cell_ids(lab)
    lab, _ = ClearOutputPreprocessor().preprocess(lab, {})
    lab, _ = ClearMetadataPreprocessor(
        preserve_cell_metadata_mask=KEPT_CELL_METADATA,
        preserve_nb_metadata_mask=KEPT_NOTEBOOK_METADATA).preprocess(lab, {})
    exercises, current, heading = [], None, None
    for index, cell in enumerate(lab.cells):
        where = f"{name}, cell {index}"
        cell.metadata = dict(cell.get("metadata", {}))
        cell.metadata.pop(METADATA_KEY, None)
        if cell.cell_type == "markdown":
            cell.source, _ = strip_markdown(cell.source, where)
            heading = _heading(cell.source) or heading
            continue
        if cell.cell_type != "code":
            continue
        cell.source, blocks = strip_code(cell.source, where)
        if blocks:
            _check_syntax(cell.source, where)
            if current is None:
                current = {"number": len(exercises) + 1, "title": heading or ""}
                exercises.append(current)
                heading = None
            role = "exercise"
        elif current is not None:
            role, current = "check", None
        else:
            continue
        cell.metadata[METADATA_KEY] = {"role": role, "exercise": exercises[-1]["number"],
                                       "title": exercises[-1]["title"]}
        tags = list(cell.metadata.get("tags", []))
        cell.metadata["tags"] = tags + [RAISES_TAG] * (RAISES_TAG not in tags)
    if current is not None:
        raise LabError(f"{name}: exercise {current['number']} has no check cell after it "
                       "(a code cell without solution markers)")
    lab.metadata = dict(lab.metadata)
    lab.metadata[METADATA_KEY] = {
        "generated_from": f"solutions/{name}",
        "note": "Generated by `python -m workbook.labs`: edit the solution, not this file.",
        "exercises": exercises,
    }
    lab = nbformat.from_dict(lab)
    lab.metadata[METADATA_KEY]["cells"] = fingerprint(lab)
    nbformat.validate(lab)
    return lab


def _give_cell_ids(nb):
    """Cell ids for a notebook saved before ids existed (nbformat < 4.5), derived from the
    cells so that the lab is the same every time (nbformat would draw random ones)."""
    if nb.nbformat == 4 and nb.nbformat_minor < 5:
        nb.nbformat_minor = 5
    for index, cell in enumerate(nb.cells):
        if not cell.get("id"):
            digest = hashlib.sha1(cell.source.encode("utf-8")).hexdigest()[:8]
            cell["id"] = f"cell-{index}-{digest}"


def lab_text(solution_path):
    """The exact text of the lab generated from a solution notebook file."""
    solution_path = Path(solution_path)
    solution = nbformat.read(solution_path, as_version=4)
    text = nbformat.writes(make_lab(solution, solution_path.name), version=4)
    return text if text.endswith("\n") else text + "\n"


def committed_text(path):
    """The text of ``path`` as committed in git (``HEAD``), or None: not in a git checkout,
    not committed yet, or no ``git`` program."""
    path = Path(path)
    try:
        result = subprocess.run(["git", "show", f"HEAD:./{path.name}"], cwd=path.parent,
                                capture_output=True, text=True, encoding="utf-8")
    except OSError:
        return None
    return result.stdout if result.returncode == 0 else None


def _sources(nb):
    return [(cell.cell_type, cell.source) for cell in nb.cells]


def _digest(cell):
    return hashlib.sha1(json.dumps([cell.cell_type, cell.source]).encode("utf-8")).hexdigest()[:16]


def fingerprint(nb):
    """``{cell id: digest of its type and source}`` for ``nb``'s cells. The builder records
    it in the lab's metadata: a cell that still gives its digest is the builder's, one that
    does not is a learner's edit (committed to git or not), whatever the solution became."""
    return {cell.get("id"): _digest(cell) for cell in nb.cells}


def _edits_since_built(nb, recorded, generated):
    """``(exercise numbers, other cells, added, deleted)``: the cells of ``nb`` that differ
    both from what the builder wrote (the digests it ``recorded``) and from the lab
    ``generated`` now (a cell a merge brought up to date is not a learner's)."""
    now = fingerprint(generated)
    exercises, others, added = set(), 0, 0
    for cell in nb.cells:
        cell_id, digest = cell.get("id"), _digest(cell)
        if digest in (recorded.get(cell_id), now.get(cell_id)):
            continue
        if cell_id not in recorded and cell_id not in now:
            added += 1
            continue
        number = cell.metadata.get(METADATA_KEY, {}).get("exercise")
        if number is None:
            others += 1
        else:
            exercises.add(number)
    ids = {cell.get("id") for cell in nb.cells}
    deleted = sum(cell_id not in ids for cell_id in recorded if cell_id in now)
    return exercises, others, added, deleted


def learner_changes(path, text):
    """What the lab file ``path`` holds beyond what the builder wrote, as short phrases
    (``[]``: nothing); ``text`` is the lab generated now.

    A lab that records the builder's :func:`fingerprint` is the builder's output exactly
    when its cells still match it; otherwise every cell that differs from ``text`` is the
    learner's, also when the learner committed the file. A lab from before fingerprints:
    edited cells count when the sources differ both from ``text`` and from the committed
    lab; without a committed lab (no git), only edited exercise cells and added cells
    count, since other cells also differ in a lab that is merely out of date. Outputs
    always count.
    """
    nb = nbformat.read(path, as_version=4)
    generated = nbformat.reads(text, as_version=4)
    recorded = nb.metadata.get(METADATA_KEY, {}).get("cells")
    committed = committed_text(path) if not isinstance(recorded, dict) else None
    if isinstance(recorded, dict):
        exercises, others, added, deleted = _edits_since_built(nb, recorded, generated)
    elif committed is None:
        exercises, others, added, deleted = _edits(nb, generated)
        others = deleted = 0
    elif _sources(nb) == _sources(nbformat.reads(committed, as_version=4)):
        exercises, others, added, deleted = set(), 0, 0, 0
    else:
        exercises, others, added, deleted = _edits(nb, generated)
    edited = [f"exercise {n}" for n in sorted(exercises)] + _count(others, "other cell")
    changes = [f"edited: {', '.join(edited)}"] if edited else []
    changes += _count(added, "cell", " added") + _count(deleted, "cell", " deleted")
    ran = sum(bool(cell.get("outputs") or cell.get("execution_count"))
              for cell in nb.cells if cell.cell_type == "code")
    return changes + _count(ran, "cell", " with outputs")


def _count(n, noun, suffix=""):
    """``["2 cells added"]``, or ``[]`` for none."""
    return [f"{n} {noun}{'s' * (n > 1)}{suffix}"] if n else []


def _edits(nb, lab):
    """``(exercise numbers, other cells, added, deleted)``: how ``nb``'s cells differ from
    ``lab``'s, matched by cell id."""
    generated = {cell.get("id"): cell for cell in lab.cells}
    exercises, others, added = set(), 0, 0
    for cell in nb.cells:
        original = generated.pop(cell.get("id"), None)
        if original is None:
            added += 1
        elif original.source != cell.source:
            number = original.metadata.get(METADATA_KEY, {}).get("exercise")
            if number is None:
                others += 1
            else:
                exercises.add(number)
    return exercises, others, added, len(generated)


def unreadable(path, error):
    """Why the notebook file ``path`` could not be read (``error``), in a few words."""
    try:
        conflict = "<<<<<<<" in Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        conflict = False
    if conflict:
        return "cannot be read: a merge conflict (look for the <<<<<<< lines)"
    return f"cannot be read: {(f'{type(error).__name__}: {error}'.splitlines() or [''])[0]}"


def build(solutions_dir="solutions", labs_dir="labs", names=None, force=False, log=print,
          errors=None):
    """(Re)write the lab of every solution notebook (or of those in ``names``).

    Returns the paths written. A lab that holds a learner's work (:func:`learner_changes`)
    is kept, saying so, unless ``force``. A solution that makes no lab, or a lab file that
    cannot be read (a merge conflict), is left as it is and added to ``errors`` as
    ``(path, reason)``; the other labs are built.
    """
    solutions_dir, labs_dir = Path(solutions_dir), Path(labs_dir)
    errors = [] if errors is None else errors
    written = []
    for solution in _solutions(solutions_dir, names):
        target = labs_dir / solution.name
        try:
            text = lab_text(solution)
        except LabError as error:
            errors.append((solution, str(error)))
            continue
        if target.exists() and target.read_bytes() == text.encode("utf-8"):
            continue
        try:
            changes = learner_changes(target, text) if target.exists() and not force else []
        except Exception as error:  # noqa: BLE001 — not a notebook (a merge conflict, ...)
            errors.append((target, unreadable(target, error)))
            continue
        if changes:
            log(f"kept {target}: it holds your work ({'; '.join(changes)}). For a fresh "
                f"lab, move yours aside (mv {target} {target.with_suffix('.mine.ipynb')}) "
                "and run `make labs` again, or replace it with `make labs FORCE=1`.")
            continue
        labs_dir.mkdir(parents=True, exist_ok=True)
        with open(target, "w", encoding="utf-8", newline="\n") as file:
            file.write(text)
        log(f"wrote {target}")
        written.append(target)
    for orphan in _orphans(solutions_dir, labs_dir, names):
        log(f"warning: {orphan} has no solution in {solutions_dir}/")
    return written


def stale(solutions_dir="solutions", labs_dir="labs", names=None, log=print):
    """``[(lab_path, reason), ...]`` for every lab that is missing, out of date or orphaned.

    A lab that holds a learner's work is judged by its committed version (git ``HEAD``);
    without one it is not judged, and ``log`` says so.
    """
    solutions_dir, labs_dir = Path(solutions_dir), Path(labs_dir)
    problems = []
    for solution in _solutions(solutions_dir, names):
        target = labs_dir / solution.name
        try:
            text = lab_text(solution)
        except LabError as error:
            problems.append((solution, f"makes no lab: {error}"))
            continue
        if not target.exists():
            problems.append((target, f"missing (generate it from {solution})"))
            continue
        if target.read_bytes() == text.encode("utf-8"):
            continue
        try:
            changes = learner_changes(target, text)
        except Exception as error:  # noqa: BLE001 — not a notebook (a merge conflict, ...)
            problems.append((target, unreadable(target, error)))
            continue
        if not changes:
            problems.append((target, f"out of date with {solution}"))
            continue
        committed = committed_text(target)
        if committed is None:
            log(f"{target}: not compared with {solution}: it holds your work "
                f"({'; '.join(changes)}) and git has no committed version of it")
        elif committed != text:
            problems.append((target, f"its committed version is out of date with {solution} "
                                     f"(the file holds your work: {'; '.join(changes)})"))
    for orphan in _orphans(solutions_dir, labs_dir, names):
        problems.append((orphan, f"has no solution in {solutions_dir}/"))
    return problems


def _solutions(solutions_dir, names):
    if names:
        paths = [solutions_dir / Path(name).name for name in names]
        for path in paths:
            if not path.exists():
                raise FileNotFoundError(f"no solution notebook {path}")
        return paths
    return sorted(solutions_dir.glob("*.ipynb"))


def _orphans(solutions_dir, labs_dir, names):
    if names:
        return []
    return [lab for lab in sorted(labs_dir.glob("*.ipynb"))
            if not (solutions_dir / lab.name).exists()]


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m workbook.labs",
        description="Generate labs/ from solutions/ (answers removed, outputs stripped).")
    parser.add_argument("names", nargs="*", help="solution notebooks to build (default: all)")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 listing labs that are missing or stale")
    parser.add_argument("--force", action="store_true",
                        help="overwrite labs even if they hold a learner's work")
    parser.add_argument("--solutions", default="solutions", help="default: %(default)s")
    parser.add_argument("--labs", default="labs", help="default: %(default)s")
    args = parser.parse_args(argv)
    try:
        if args.check:
            problems = stale(args.solutions, args.labs, args.names)
            for path, reason in problems:
                print(f"{path}: {reason}")
            if problems:
                print(f"{len(problems)} lab(s) out of date: run `make labs` "
                      "(python -m workbook.labs) and commit the result.")
                return 1
            print(f"labs are up to date with {args.solutions}/")
            return 0
        errors = []
        build(args.solutions, args.labs, args.names, force=args.force, errors=errors)
        for path, reason in errors:
            print(f"error: {path}: {reason}", file=sys.stderr)
        return 2 if errors else 0
    except (LabError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
