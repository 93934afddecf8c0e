from sakura.cli.main import app

app()
