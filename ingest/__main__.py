from ingest.cli import main

main()
