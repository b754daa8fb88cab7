import typer
from typer.testing import CliRunner

from workloads import commands

app = typer.Typer()
commands.register(app)
runner = CliRunner()


def test_list_shows_every_mix():
    result = runner.invoke(app, ["workloads", "list"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    for name in ("azure-code-2023", "mooncake-conversation", "bwb-translation", "lmsys"):
        assert name in result.output
    assert "8,819" in result.output and "CC-BY-4.0" in result.output



def test_list_is_readable_at_80_columns():
    result = runner.invoke(app, ["workloads", "list"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    assert "…" not in result.output and max(len(line) for line in result.output.splitlines()) <= 80
    for text in ("mooncake-conversation", "12,031", "27,367", "trace+ids", "Mooncake FAST25", "Apache-2.0"):
        assert text in result.output

def test_show_with_plot_writes_a_png(tmp_path):
    plot = tmp_path / "azure.png"
    result = runner.invoke(app, ["workloads", "show", "azure-code-2023", "--plot", str(plot)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "Splitwise" in result.output and "iat_cv" in result.output
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and plot.stat().st_size > 10_000


def test_show_a_generator_and_an_unknown_name(tmp_path):
    result = runner.invoke(app, ["workloads", "show", "random", "--plot", str(tmp_path / "r.png")])
    assert result.exit_code == 0 and (tmp_path / "r.png").stat().st_size > 0
    result = runner.invoke(app, ["workloads", "show", "nope"])
    assert result.exit_code == 1 and "unknown workload" in result.output
