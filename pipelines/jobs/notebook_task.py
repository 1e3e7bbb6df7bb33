"""A notebook_task: the notebook run top to bottom in a kernel of this environment, its
base_parameters first (`dbutils.widgets.get(name)`, or the dict `parameters`), the executed
notebook written to OUT (the job runner keeps it with the task's log).

Usage: python -m pipelines.jobs.notebook_task NOTEBOOK OUT PARAMETERS_JSON
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

try:
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError
except ImportError as missing:  # the notebooks extra is not installed
    sys.exit(f"error: a notebook task needs {missing.name}: pip install '.[notebooks]'")

# the first cell: the parameters, and the part of Databricks's dbutils that a job task uses
INJECTED = """\
parameters = {parameters!r}


class dbutils:  # noqa: N801 (Databricks's name)
    class widgets:  # noqa: N801
        @staticmethod
        def get(name):
            return parameters[name]

    class jobs:  # noqa: N801
        class taskValues:  # noqa: N801
            from pipelines.task_values import get, set
"""


def main() -> int:
    notebook, out, parameters = Path(sys.argv[1]), Path(sys.argv[2]), json.loads(sys.argv[3])
    nb = nbformat.read(notebook, as_version=4)
    cell = nbformat.v4.new_code_cell(INJECTED.format(parameters=parameters))
    cell.metadata["tags"] = ["injected-parameters"]
    nb.cells.insert(0, cell)
    folder = {"metadata": {"path": str(notebook.parent)}}
    try:
        NotebookClient(nb, timeout=None, kernel_name="python3", resources=folder).execute()
    except CellExecutionError as e:
        print(f"error: notebook {notebook} failed: {e.ename}: {e.evalue}", flush=True)
        return 1
    finally:
        nbformat.write(nb, out)
    print(f"notebook {notebook} ran; executed notebook: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
