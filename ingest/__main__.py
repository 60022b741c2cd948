"""``ingest`` and ``python -m ingest``: the command line (:mod:`ingest.cli`), its imports made with
the garbage collector paused (:func:`ingest.nogc.pause_startup`)."""

from ingest import nogc


def main() -> None:
    nogc.pause_startup()
    from ingest.cli import main as cli

    cli()


if __name__ == "__main__":
    main()
