from sharpinf.cli import main

main()
