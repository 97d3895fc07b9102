"""The file formats, a room per family: IDX (idx/), Caffe's Datum (datum/), PNG written (png/),
image bytes within OpenCV's limits (imdecode/), image files as OpenCV reads them (imread/), lists
(lists/); protobuf's wire format and the PNG and JPEG readers of own images beside them."""
