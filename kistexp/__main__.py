from kistexp.cli import main

main()
