from suites.engine import oom_kills


def test_the_kernels_out_of_memory_kills_are_read_where_linux_counts_them(tmp_path, monkeypatch):
    assert isinstance(oom_kills.kernel_oom_kills(), int)  # this machine's Linux counts them
    vmstat = tmp_path / "vmstat"
    monkeypatch.setattr(oom_kills, "VMSTAT", vmstat)
    vmstat.write_text("pgfault 12\noom_kill 3\nthp_fault_alloc 0\n")
    assert oom_kills.kernel_oom_kills() == 3
    vmstat.write_text("pgfault 12\n")  # a kernel before 4.13
    assert oom_kills.kernel_oom_kills() is None
    vmstat.unlink()  # not Linux
    assert oom_kills.kernel_oom_kills() is None


def test_a_death_is_put_to_the_oom_killer_only_where_its_count_rose(tmp_path, monkeypatch):
    vmstat = tmp_path / "vmstat"
    monkeypatch.setattr(oom_kills, "VMSTAT", vmstat)
    vmstat.write_text("oom_kill 5\n")
    assert oom_kills.oom_killed(5, "logs") is None
    assert oom_kills.oom_killed(None, "logs") is None  # the count was not readable when the cell began
    killed = oom_kills.oom_killed(4, "[rank 1]\nlast words")
    assert killed is not None and killed.failure_class == "crash"
    assert "rose from 4 to 5" in killed.message and killed.message.endswith("[rank 1]\nlast words")
    vmstat.unlink()
    assert oom_kills.oom_killed(4, "logs") is None
