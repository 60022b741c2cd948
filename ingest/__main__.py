"""``ingest`` and ``python -m ingest``: the command line (:mod:`ingest.cli`), imported once the
process has begun as ours do (:func:`ingest.startup.begin`: the garbage collector paused, one BLAS
thread)."""

from ingest import startup


def main() -> None:
    startup.begin()
    from ingest.cli import main as cli

    cli()


if __name__ == "__main__":
    main()
