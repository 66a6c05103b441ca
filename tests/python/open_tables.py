"""Opens embodyflow table directories as a researcher would, with polars,
pandas (pyarrow dataset) and duckdb, and checks each sees the table's rows
with its natural column types.

usage: open_tables.py EXPECTED.json
EXPECTED.json: [{"dir": ..., "rows": N, "columns": [["name", "arrow type"], ...]}, ...]
Prints one line per check and `N passed, M failed` last; exits 1 on any failure.
"""
import json
import sys

import duckdb
import pandas as pd
import polars as pl
import pyarrow.dataset as ds

# The Arrow types of the schema files as polars names them.
POLARS = {
    "utf8": pl.String, "binary": pl.Binary, "bool": pl.Boolean, "i8": pl.Int8,
    "i32": pl.Int32, "i64": pl.Int64, "f32": pl.Float32, "f64": pl.Float64,
}


def polars_type(text):
    text = text.strip().rstrip("?")
    if text.startswith("list<"):
        return pl.List(polars_type(text[5:-1]))
    if text.startswith("struct<"):
        fields = []
        depth, start, inner = 0, 0, text[7:-1]
        for i, ch in enumerate(inner + ","):
            if ch in "<":
                depth += 1
            elif ch in ">":
                depth -= 1
            elif ch == "," and depth == 0:
                name, kind = inner[start:i].split(":", 1)
                fields.append(pl.Field(name.strip(), polars_type(kind)))
                start = i + 1
        return pl.Struct(fields)
    return POLARS[text]


def main():
    tables = json.load(open(sys.argv[1]))
    passed = failed = 0

    def check(name, ok, detail=""):
        nonlocal passed, failed
        print(("ok   " if ok else "FAIL ") + name + ("" if ok else f": {detail}"))
        if ok:
            passed += 1
        else:
            failed += 1

    for table in tables:
        d, rows = table["dir"], table["rows"]
        columns = dict(table["columns"])  # insertion order = storage order
        label = d.rstrip("/").split("/")[-1]
        for how, read in [
            ("polars read_parquet(dir)", lambda: pl.read_parquet(d)),
            ("polars scan_parquet(dir)", lambda: pl.scan_parquet(d).collect()),
        ]:
            try:
                frame = read()
                want = {k: polars_type(v) for k, v in columns.items()}
                got = dict(frame.schema)
                same = got == want and list(got) == list(want)
                check(f"{label}: {how}", frame.height == rows and same,
                      f"{frame.height} rows (want {rows}), schema {got} (want {want})")
            except Exception as e:  # noqa: BLE001 - a failure to open is the finding
                check(f"{label}: {how}", False, repr(e))
        try:
            frame = pd.read_parquet(d)
            check(f"{label}: pandas read_parquet(dir)",
                  len(frame) == rows and list(frame.columns) == list(columns),
                  f"{len(frame)} rows, columns {list(frame.columns)}")
        except Exception as e:  # noqa: BLE001
            check(f"{label}: pandas read_parquet(dir)", False, repr(e))
        try:
            table_ = ds.dataset(d, format="parquet").to_table()
            check(f"{label}: pyarrow dataset(dir)",
                  table_.num_rows == rows and table_.column_names == list(columns),
                  f"{table_.num_rows} rows, columns {table_.column_names}")
        except Exception as e:  # noqa: BLE001
            check(f"{label}: pyarrow dataset(dir)", False, repr(e))
        try:
            n = duckdb.sql(f"select count(*) from read_parquet('{d}/*.parquet')").fetchall()[0][0]
            names = [c[0] for c in duckdb.sql(f"describe select * from read_parquet('{d}/*.parquet')").fetchall()]
            check(f"{label}: duckdb read_parquet('dir/*.parquet')",
                  n == rows and names == list(columns), f"{n} rows, columns {names}")
        except Exception as e:  # noqa: BLE001
            check(f"{label}: duckdb read_parquet('dir/*.parquet')", False, repr(e))
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
