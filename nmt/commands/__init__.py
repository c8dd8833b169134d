"""Each command's plain function, one module per command, named for it: preprocess, train,
average, translate, export, import_, serve. The entry points in nmt.cli convert the config and
call them; tests call them directly. None imports another. A command's part of its own is named
for it: translate_io, nmt-translate's text in and out."""
