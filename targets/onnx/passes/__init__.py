"""Graph passes only the onnx target runs, before torch.onnx translates the program."""
