from vmtax.cli import main

main()
