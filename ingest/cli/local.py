"""The commands that need nothing of yours to try ingest: ``ingest demo`` (the embedded broker, order
events, a catch-up and what a user looks at) and ``ingest broker`` (the embedded broker alone, to
point a pipeline at)."""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Annotated

import typer

from ingest.cli.common import LogFormat, LogFormatOption, VerboseOption, app, guarded, out
from ingest.errors import BrokerUnavailable


@app.command()
def demo(
    records: Annotated[int, typer.Option(help="Order events to produce.")] = 200_000,
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            "-c",
            help="Pipeline YAML for the demo. Default: the packaged orders example, its warehouse in ./warehouse.",
            show_default=False,
        ),
    ] = None,
    verbose: VerboseOption = False,
    log_format: LogFormatOption = LogFormat.text,
) -> None:
    """Start the embedded broker, produce order events, ingest them, show the result, stop."""
    from ingest import demo as demo_module

    guarded(False, lambda: demo_module.main(records=records, config_path=config, console=out))


@app.command()
def broker(
    port: Annotated[int, typer.Option(help="Port on 127.0.0.1 (conf/orders.yaml's default is 9092).")] = 9092,
) -> None:
    """Start the embedded Kafka-protocol broker (tansu, in-memory storage) and keep it running until
    Ctrl-C or SIGTERM: a broker to point a pipeline at while you try it. Needs the ``embedded`` extra."""
    from ingest.kafka.embedded import EmbeddedBroker

    def body() -> None:
        stop = threading.Event()
        previous = signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
        try:
            with EmbeddedBroker(port=port) as running:
                out.print(
                    f"embedded broker (tansu) on {running.bootstrap_servers}, in memory: its topics go when it stops\n"
                    f"  export KAFKA_BOOTSTRAP_SERVERS={running.bootstrap_servers}\n"
                    "Ctrl-C stops it.",
                    soft_wrap=True,  # the address on one line, whatever the width
                )
                try:
                    while not stop.wait(0.5):
                        if not running.alive:
                            raise BrokerUnavailable(f"the embedded broker on port {port} exited by itself")
                except KeyboardInterrupt:
                    pass
        finally:
            signal.signal(signal.SIGTERM, previous)
        out.print("embedded broker stopped")

    guarded(False, body)
