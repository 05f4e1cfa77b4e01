"""torch_locate finds a package and its dist-info from the file system, never importing it."""

from __future__ import annotations

import sys

from tests.fixtures.payloads import env_with_path, run_payload, write_dist_info


def make_package(site, package, version, dist_name=None, body="raise RuntimeError('imported!')\n"):
    """A package whose import would fail loudly, so a successful locate proves no import."""
    (site / package).mkdir(parents=True)
    (site / package / "__init__.py").write_text(body)
    return write_dist_info(site, dist_name or package, version, package)


def locate(site, package, **kwargs):
    return run_payload(sys.executable, "torch_locate", {"package": package},
                       env=env_with_path(site), **kwargs)


def test_finds_the_package_and_its_version_without_importing_it(tmp_path):
    site = tmp_path / "site"
    dist_info = make_package(site, "torch", "2.13.0+cpu")
    result = locate(site, "torch").expect_result()
    assert result["version"] == "2.13.0+cpu"
    assert result["site_packages"] == str(site)
    assert result["package_dir"] == str(site / "torch")
    assert result["dist_info"] == str(dist_info)
    assert result["import_name"] == result["distribution"] == "torch"
    assert result["python"] == sys.executable
    assert result["python_version"].count(".") == 2


def test_a_distribution_name_leads_to_its_import_name(tmp_path):
    site = tmp_path / "site"
    make_package(site, "yaml", "6.0.2", dist_name="PyYAML")
    for asked in ("PyYAML", "pyyaml", "yaml"):
        result = locate(site, asked).expect_result()
        assert (result["import_name"], result["distribution"], result["version"]) == \
            ("yaml", "PyYAML", "6.0.2"), asked


def test_dashes_and_underscores_in_distribution_names_are_equal(tmp_path):
    site = tmp_path / "site"
    make_package(site, "typing_extras", "1.0", dist_name="typing_extras")
    assert locate(site, "typing-extras").expect_result()["import_name"] == "typing_extras"


def test_a_single_module_file_is_found(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "solo.py").write_text("raise RuntimeError('imported!')\n")
    result = locate(site, "solo").expect_result()
    assert result["package_dir"] == str(site / "solo.py") and result["version"] is None


def test_missing_package_is_an_error_that_names_the_python(tmp_path):
    error = locate(tmp_path, "no_such_package_here").expect_error("not-installed")
    assert sys.executable in error["message"] and "not installed" in error["message"]


def test_a_same_named_folder_in_the_working_directory_is_ignored(tmp_path):
    # `python -` puts the working directory first on sys.path; the installed package wins.
    site = tmp_path / "site"
    make_package(site, "torch", "2.13.0")
    (tmp_path / "work" / "torch").mkdir(parents=True)
    (tmp_path / "work" / "torch" / "__init__.py").write_text("")
    run = locate(site, "torch", via_stdin=True, cwd=str(tmp_path / "work"))
    assert run.expect_result()["package_dir"] == str(site / "torch")


def test_names_that_are_not_package_names_are_refused(tmp_path):
    for name in ("$(id)", "../etc", "a b", ""):
        locate(tmp_path, name).expect_error("bad-args")


def test_a_distribution_whose_own_package_is_gone_is_not_installed(tmp_path):
    """torch's wheel installs functorch and torchgen beside torch: with torch's folder gone
    (deleted by hand, a half-finished uninstall) the dist-info must not lead to functorch."""
    site = tmp_path / "site"
    make_package(site, "functorch", "2.13.0")
    make_package(site, "torch", "2.13.0+cpu")
    (site / "torch-2.13.0+cpu.dist-info" / "top_level.txt").write_text("functorch\ntorch\ntorchgen\n")
    for path in (site / "torch").iterdir():
        path.unlink()
    (site / "torch").rmdir()
    error = locate(site, "torch").expect_error("not-installed")
    assert "torch-2.13.0+cpu.dist-info" in error["message"] and "folder is gone" in error["message"]
