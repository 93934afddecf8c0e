from sakura.cli import app

app()
