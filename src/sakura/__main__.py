from sakura.cli.main import main

main()
