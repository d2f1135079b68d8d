from profiler_kit.cli import main

main()
