from fl.train import entry

entry()
