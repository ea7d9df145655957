"""``reproarchive demo``: the built-in end-to-end example."""

from __future__ import annotations

import click

from .app import emit_json, main
from .exit_codes import INTERNAL, exit_codes


@main.command(epilog=exit_codes((0, "every step saw what it should"),
                                (2, "usage error, or a step did not see what it should (one line says which)"),
                                (4, "the demo's folder cannot be written"), INTERNAL))
@click.option("-C", "--directory", default="demo-out", show_default=True, type=click.Path(file_okay=False),
              help="Folder for the demo's archives.")
@click.option("--no-minify", is_flag=True, help="Stop after the replay.")
@click.option("--json", "as_json", is_flag=True, help="Print only the results (paths, outcomes, statistics) as JSON.")
def demo(directory: str, no_minify: bool, as_json: bool) -> None:
    """Run the whole story on a built-in example, on CPU.

    A real torch.compile (inductor) failure -- made with PyTorch's own relu bug injector -- is
    captured into an archive, verified, inspected, replayed without the injector (the archive's
    recorded config brings the bug back) and minified to the op that fails. Then a program whose
    compiled kernel aborts the process leaves an archive that replays the crash in a child
    process.
    """
    from .demo import run_demo

    say = (lambda text: None) if as_json else click.echo
    result = run_demo(directory, say=say, minify=not no_minify)
    if as_json:
        emit_json(result)
