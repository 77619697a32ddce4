/* The parts of onnxruntime's C ABI that tilefuse uses, declared by tilefuse.
 *
 * No package ships onnxruntime_c_api.h, and this library must not link libonnxruntime
 * (the Python module carries its own copy). Everything is reached through the OrtApiBase
 * pointer onnxruntime hands us. OrtApi is an append-only table of function pointers whose
 * slots never move, so it is declared here as an array indexed by named slots; the slot
 * numbers are checked against the installed onnxruntime by tests/ort/test_abi.py.
 */
#ifndef TILEFUSE_ORT_ABI_H
#define TILEFUSE_ORT_ABI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct OrtStatus OrtStatus;
typedef struct OrtKernelContext OrtKernelContext;
typedef struct OrtKernelInfo OrtKernelInfo;
typedef struct OrtValue OrtValue;
typedef struct OrtTensorTypeAndShapeInfo OrtTensorTypeAndShapeInfo;
typedef struct OrtSessionOptions OrtSessionOptions;
typedef struct OrtCustomOpDomain OrtCustomOpDomain;
typedef struct OrtGraph OrtGraph;
typedef struct OrtNode OrtNode;
typedef struct OrtOpAttr OrtOpAttr;
typedef struct OrtLogger OrtLogger;
typedef struct OrtHardwareDevice OrtHardwareDevice;
typedef struct OrtEpDevice OrtEpDevice;
typedef struct OrtKeyValuePairs OrtKeyValuePairs;
typedef struct OrtEpGraphSupportInfo OrtEpGraphSupportInfo;
typedef struct OrtNodeComputeContext OrtNodeComputeContext;
typedef struct OrtMemoryInfo OrtMemoryInfo;
typedef struct OrtMemoryDevice OrtMemoryDevice;
typedef struct OrtRunOptions OrtRunOptions;
typedef struct OrtValueInfo OrtValueInfo;
typedef struct OrtSyncStream OrtSyncStream;
typedef void OrtApi; /* a table of function pointers: see the slots below */

typedef struct OrtApiBase {
  const OrtApi* (*GetApi)(uint32_t version);
  const char* (*GetVersionString)(void);
} OrtApiBase;

/* OrtErrorCode */
enum { ORT_OK = 0, ORT_FAIL = 1, ORT_INVALID_ARGUMENT = 2, ORT_NO_SUCHFILE = 3, ORT_INVALID_GRAPH = 10 };

/* ONNXTensorElementDataType: the same numbers as onnx.TensorProto.DataType */
enum { TF_ELEM_UNDEFINED = 0 };

/* OrtOpAttrType */
enum { ORT_OP_ATTR_INT = 1, ORT_OP_ATTR_STRING = 5 };

/* OrtHardwareDeviceType */
enum { ORT_HW_CPU = 0, ORT_HW_GPU = 1 };

/* OrtMemoryInfoDeviceType, OrtDeviceMemoryType, OrtAllocatorType */
enum { ORT_MEM_DEVICE_CPU = 0, ORT_MEM_DEVICE_GPU = 1 };
enum { ORT_DEVICE_MEMORY_DEFAULT = 0, ORT_DEVICE_MEMORY_HOST_ACCESSIBLE = 5 };
enum { ORT_DEVICE_ALLOCATOR = 0, ORT_ARENA_ALLOCATOR = 1 };

#define TF_NVIDIA_VENDOR_ID 0x10de /* PCI vendor id */

/* OrtApi slots (indexes into the table). */
enum {
  SLOT_CreateStatus = 0,
  SLOT_GetErrorMessage = 2,
  SLOT_CreateCustomOpDomain = 26,
  SLOT_CustomOpDomain_Add = 27,
  SLOT_AddCustomOpDomain = 28,
  SLOT_GetTensorMutableData = 51,
  SLOT_GetTensorElementType = 60,
  SLOT_GetDimensionsCount = 61,
  SLOT_GetDimensions = 62,
  SLOT_GetTensorTypeAndShape = 65,
  SLOT_KernelInfoGetAttribute_string = 87,
  SLOT_KernelContext_GetInputCount = 88,
  SLOT_KernelContext_GetOutputCount = 89,
  SLOT_KernelContext_GetInput = 90,
  SLOT_KernelContext_GetOutput = 91,
  SLOT_ReleaseStatus = 93,
  SLOT_ReleaseMemoryInfo = 94,
  SLOT_ReleaseTensorTypeAndShapeInfo = 99,
  SLOT_KernelContext_GetGPUComputeStream = 193,
  SLOT_KernelInfo_GetNodeName = 244,
  SLOT_ReadOpAttr = 272,
  SLOT_KernelContext_ParallelFor = 274, /* C API 17 */
  SLOT_GetValueInfoName = 289,
  SLOT_HardwareDevice_Type = 307,
  SLOT_HardwareDevice_VendorId = 308,
  SLOT_HardwareDevice_DeviceId = 310,
  SLOT_GetEpApi = 317,
  SLOT_GetTensorSizeInBytes = 318,
  SLOT_CreateMemoryInfo_V2 = 320,
  SLOT_Graph_GetModelPath = 334,
  SLOT_Graph_GetNumNodes = 344,
  SLOT_Graph_GetNodes = 345,
  SLOT_Node_GetName = 349,
  SLOT_Node_GetOperatorType = 350,
  SLOT_Node_GetDomain = 351,
  SLOT_Node_GetNumInputs = 353,
  SLOT_Node_GetInputs = 354,
  SLOT_Node_GetNumOutputs = 355,
  SLOT_Node_GetOutputs = 356,
  SLOT_Node_GetAttributeByName = 361,
};

/* OrtEpApi slots (the table GetEpApi returns). */
enum {
  EPSLOT_CreateEpDevice = 0,
  EPSLOT_ReleaseEpDevice = 1,
  EPSLOT_EpGraphSupportInfo_AddNodesToFuse = 2,
  EPSLOT_EpDevice_AddAllocatorInfo = 5,
  EPSLOT_MemoryInfo_GetMemoryDevice = 6,
  EPSLOT_Value_GetMemoryDevice = 7,
  EPSLOT_MemoryDevice_AreEqual = 8,
  EPSLOT_MemoryDevice_GetDeviceType = 9,
  EPSLOT_MemoryDevice_GetMemoryType = 10,
  EPSLOT_MemoryDevice_GetVendorId = 11,
  EPSLOT_MemoryDevice_GetDeviceId = 12,
  EPSLOT_SyncStream_GetImpl = 13,
};

#define ORT_FN(api, slot, type) ((type)(((void* const*)(api))[slot]))

/* Signatures of the slots used, by name. */
typedef OrtStatus* (*CreateStatus_fn)(int code, const char* msg);
typedef const char* (*GetErrorMessage_fn)(const OrtStatus*);
typedef void (*ReleaseStatus_fn)(OrtStatus*);
typedef OrtStatus* (*CreateCustomOpDomain_fn)(const char* domain, OrtCustomOpDomain** out);
typedef OrtStatus* (*CustomOpDomain_Add_fn)(OrtCustomOpDomain*, const void* op);
typedef OrtStatus* (*AddCustomOpDomain_fn)(OrtSessionOptions*, OrtCustomOpDomain*);
typedef OrtStatus* (*GetTensorMutableData_fn)(OrtValue*, void** out);
typedef OrtStatus* (*GetTensorElementType_fn)(const OrtTensorTypeAndShapeInfo*, int* out);
typedef OrtStatus* (*GetDimensionsCount_fn)(const OrtTensorTypeAndShapeInfo*, size_t* out);
typedef OrtStatus* (*GetDimensions_fn)(const OrtTensorTypeAndShapeInfo*, int64_t* dims, size_t n);
typedef OrtStatus* (*GetTensorTypeAndShape_fn)(const OrtValue*, OrtTensorTypeAndShapeInfo** out);
typedef OrtStatus* (*KernelInfoGetAttribute_string_fn)(const OrtKernelInfo*, const char* name, char* out, size_t* size);
typedef OrtStatus* (*KernelContext_GetCount_fn)(const OrtKernelContext*, size_t* out);
typedef OrtStatus* (*KernelContext_GetInput_fn)(const OrtKernelContext*, size_t i, const OrtValue** out);
typedef OrtStatus* (*KernelContext_GetOutput_fn)(OrtKernelContext*, size_t i, const int64_t* dims, size_t n, OrtValue** out);
typedef void (*ReleaseTensorTypeAndShapeInfo_fn)(OrtTensorTypeAndShapeInfo*);
typedef OrtStatus* (*KernelContext_GetGPUComputeStream_fn)(const OrtKernelContext*, void** out);
typedef OrtStatus* (*KernelInfo_GetNodeName_fn)(const OrtKernelInfo*, char* out, size_t* size);
typedef OrtStatus* (*ReadOpAttr_fn)(const OrtOpAttr*, int type, void* data, size_t len, size_t* out);
/* fn(usr_data, i) for each i in [0, total) on the session's intra-op pool (num_batch 0: one
 * task per i), returning when all are done */
typedef OrtStatus* (*KernelContext_ParallelFor_fn)(const OrtKernelContext*, void (*fn)(void* usr_data, size_t i),
                                                  size_t total, size_t num_batch, void* usr_data);
#define TF_PARALLEL_FOR_API 17 /* the first C API with KernelContext_ParallelFor */
typedef int (*HardwareDevice_Type_fn)(const OrtHardwareDevice*);
typedef uint32_t (*HardwareDevice_Id_fn)(const OrtHardwareDevice*);
typedef OrtStatus* (*GetTensorSizeInBytes_fn)(const OrtValue*, size_t* out);
typedef OrtStatus* (*CreateMemoryInfo_V2_fn)(const char* name, int device_type, uint32_t vendor_id, int32_t device_id,
                                            int mem_type, size_t alignment, int allocator_type, OrtMemoryInfo** out);
typedef void (*ReleaseMemoryInfo_fn)(OrtMemoryInfo*);
typedef const void* (*GetEpApi_fn)(void);
typedef OrtStatus* (*Graph_GetModelPath_fn)(const OrtGraph*, const char** out);
typedef OrtStatus* (*Graph_GetNumNodes_fn)(const OrtGraph*, size_t* out);
typedef OrtStatus* (*Graph_GetNodes_fn)(const OrtGraph*, const OrtNode** nodes, size_t n);
typedef OrtStatus* (*Node_GetString_fn)(const OrtNode*, const char** out);
typedef OrtStatus* (*Node_GetCount_fn)(const OrtNode*, size_t* out);
typedef OrtStatus* (*Node_GetValueInfos_fn)(const OrtNode*, const OrtValueInfo** out, size_t n);
typedef OrtStatus* (*GetValueInfoName_fn)(const OrtValueInfo*, const char** out);
typedef OrtStatus* (*Node_GetAttributeByName_fn)(const OrtNode*, const char* name, const OrtOpAttr** out);
typedef OrtStatus* (*CreateEpDevice_fn)(void* factory, const OrtHardwareDevice*, const OrtKeyValuePairs* metadata,
                                       const OrtKeyValuePairs* options, OrtEpDevice** out);
typedef void (*ReleaseEpDevice_fn)(OrtEpDevice*);
typedef OrtStatus* (*EpDevice_AddAllocatorInfo_fn)(OrtEpDevice*, const OrtMemoryInfo*);
typedef const OrtMemoryDevice* (*MemoryInfo_GetMemoryDevice_fn)(const OrtMemoryInfo*);
typedef const OrtMemoryDevice* (*Value_GetMemoryDevice_fn)(const OrtValue*);
typedef bool (*MemoryDevice_AreEqual_fn)(const OrtMemoryDevice*, const OrtMemoryDevice*);
typedef int (*MemoryDevice_GetEnum_fn)(const OrtMemoryDevice*); /* device type, memory type */
typedef uint32_t (*MemoryDevice_GetId_fn)(const OrtMemoryDevice*); /* vendor id, device id */
typedef OrtStatus* (*AddNodesToFuse_fn)(OrtEpGraphSupportInfo*, const OrtNode* const* nodes, size_t n,
                                        const void* fusion_options);

/* OrtCustomOp, in field order (version 16 layout; later fields are not read at that version). */
enum { TF_IO_REQUIRED = 0, TF_IO_OPTIONAL = 1, TF_IO_VARIADIC = 2 };
typedef struct OrtCustomOp OrtCustomOp;
struct OrtCustomOp {
  uint32_t version;
  void* (*CreateKernel)(const OrtCustomOp*, const OrtApi*, const OrtKernelInfo*);
  const char* (*GetName)(const OrtCustomOp*);
  const char* (*GetExecutionProviderType)(const OrtCustomOp*);
  int (*GetInputType)(const OrtCustomOp*, size_t);
  size_t (*GetInputTypeCount)(const OrtCustomOp*);
  int (*GetOutputType)(const OrtCustomOp*, size_t);
  size_t (*GetOutputTypeCount)(const OrtCustomOp*);
  void (*KernelCompute)(void* kernel, OrtKernelContext*);
  void (*KernelDestroy)(void* kernel);
  int (*GetInputCharacteristic)(const OrtCustomOp*, size_t);
  int (*GetOutputCharacteristic)(const OrtCustomOp*, size_t);
  int (*GetInputMemoryType)(const OrtCustomOp*, size_t);
  int (*GetVariadicInputMinArity)(const OrtCustomOp*);
  int (*GetVariadicInputHomogeneity)(const OrtCustomOp*);
  int (*GetVariadicOutputMinArity)(const OrtCustomOp*);
  int (*GetVariadicOutputHomogeneity)(const OrtCustomOp*);
  OrtStatus* (*CreateKernelV2)(const OrtCustomOp*, const OrtApi*, const OrtKernelInfo*, void** kernel);
  OrtStatus* (*KernelComputeV2)(void* kernel, OrtKernelContext*);
  void* InferOutputShapeFn;
  void* GetStartVersion;
  void* GetEndVersion;
  void* GetMayInplace;
  void* ReleaseMayInplace;
  void* GetAliasMap;
  void* ReleaseAliasMap;
};

/* OrtAllocator up to version 18 (Reserve); the later fields (GetStats, AllocOnStream: 23)
 * are declared so the struct has its full size, and left NULL. */
typedef struct OrtAllocator OrtAllocator;
struct OrtAllocator {
  uint32_t version;
  void* (*Alloc)(OrtAllocator*, size_t size);
  void (*Free)(OrtAllocator*, void* p);
  const OrtMemoryInfo* (*Info)(const OrtAllocator*);
  void* (*Reserve)(OrtAllocator*, size_t size);
  OrtStatus* (*GetStats)(const OrtAllocator*, OrtKeyValuePairs** out);
  void* (*AllocOnStream)(OrtAllocator*, size_t size, OrtSyncStream* stream);
};

/* OrtDataTransferImpl (1.23). */
typedef struct OrtDataTransferImpl OrtDataTransferImpl;
struct OrtDataTransferImpl {
  uint32_t ort_version_supported;
  void (*Release)(OrtDataTransferImpl*);
  bool (*CanCopy)(const OrtDataTransferImpl*, const OrtMemoryDevice* src, const OrtMemoryDevice* dst);
  OrtStatus* (*CopyTensors)(OrtDataTransferImpl*, const OrtValue** src, OrtValue** dst, OrtSyncStream** streams,
                            size_t n);
};

/* OrtSyncNotificationImpl and OrtSyncStreamImpl (1.23): a stream-aware provider's
 * onnxruntime::Stream and its notifications, implemented by the provider. */
typedef struct OrtSyncNotificationImpl OrtSyncNotificationImpl;
struct OrtSyncNotificationImpl {
  uint32_t ort_version_supported;
  void (*Release)(OrtSyncNotificationImpl*);
  OrtStatus* (*Activate)(OrtSyncNotificationImpl*);
  OrtStatus* (*WaitOnDevice)(OrtSyncNotificationImpl*, OrtSyncStream* consumer);
  OrtStatus* (*WaitOnHost)(OrtSyncNotificationImpl*);
};

typedef struct OrtSyncStreamImpl OrtSyncStreamImpl;
struct OrtSyncStreamImpl {
  uint32_t ort_version_supported;
  void (*Release)(OrtSyncStreamImpl*);
  void* (*GetHandle)(OrtSyncStreamImpl*);
  OrtStatus* (*CreateNotification)(OrtSyncStreamImpl*, OrtSyncNotificationImpl** out);
  OrtStatus* (*Flush)(OrtSyncStreamImpl*);
  OrtStatus* (*OnSessionRunEnd)(OrtSyncStreamImpl*);
};
typedef const OrtSyncStreamImpl* (*SyncStream_GetImpl_fn)(const OrtSyncStream*);

/* OrtNodeComputeInfo (1.23). */
typedef struct OrtNodeComputeInfo OrtNodeComputeInfo;
struct OrtNodeComputeInfo {
  uint32_t ort_version_supported;
  OrtStatus* (*CreateState)(OrtNodeComputeInfo*, OrtNodeComputeContext*, void** state);
  OrtStatus* (*Compute)(OrtNodeComputeInfo*, void* state, OrtKernelContext*);
  void (*ReleaseState)(OrtNodeComputeInfo*, void* state);
};

/* OrtEp, the fields of version 23. */
typedef struct OrtEp OrtEp;
struct OrtEp {
  uint32_t ort_version_supported;
  const char* (*GetName)(const OrtEp*);
  OrtStatus* (*GetCapability)(OrtEp*, const OrtGraph*, OrtEpGraphSupportInfo*);
  OrtStatus* (*Compile)(OrtEp*, const OrtGraph**, const OrtNode**, size_t, OrtNodeComputeInfo**, OrtNode**);
  void (*ReleaseNodeComputeInfos)(OrtEp*, OrtNodeComputeInfo**, size_t);
  void* GetPreferredDataLayout;
  void* ShouldConvertDataLayoutForOp;
  void* SetDynamicOptions;
  void* OnRunStart;
  void* OnRunEnd;
  void* CreateAllocator;
  void* CreateSyncStreamForDevice;
  void* GetCompiledModelCompatibilityInfo;
};

/* OrtEpFactory, the fields of version 23. */
typedef struct OrtEpFactory OrtEpFactory;
struct OrtEpFactory {
  uint32_t ort_version_supported;
  const char* (*GetName)(const OrtEpFactory*);
  const char* (*GetVendor)(const OrtEpFactory*);
  OrtStatus* (*GetSupportedDevices)(OrtEpFactory*, const OrtHardwareDevice* const* devices, size_t n,
                                    OrtEpDevice** ep_devices, size_t max_ep_devices, size_t* num_ep_devices);
  OrtStatus* (*CreateEp)(OrtEpFactory*, const OrtHardwareDevice* const* devices,
                         const OrtKeyValuePairs* const* metadata, size_t n, const OrtSessionOptions*,
                         const OrtLogger*, OrtEp** ep);
  void (*ReleaseEp)(OrtEpFactory*, OrtEp*);
  uint32_t (*GetVendorId)(const OrtEpFactory*);
  const char* (*GetVersion)(const OrtEpFactory*);
  OrtStatus* (*ValidateCompiledModelCompatibilityInfo)(OrtEpFactory*, const OrtHardwareDevice* const*, size_t,
                                                       const char*, int*);
  OrtStatus* (*CreateAllocator)(OrtEpFactory*, const OrtMemoryInfo*, const OrtKeyValuePairs*, OrtAllocator**);
  void (*ReleaseAllocator)(OrtEpFactory*, OrtAllocator*);
  OrtStatus* (*CreateDataTransfer)(OrtEpFactory*, OrtDataTransferImpl** data_transfer);
  bool (*IsStreamAware)(const OrtEpFactory*);
  OrtStatus* (*CreateSyncStreamForDevice)(OrtEpFactory*, const OrtMemoryDevice*, const OrtKeyValuePairs*,
                                          OrtSyncStreamImpl**);
};

#define TF_EXPORT __attribute__((visibility("default")))

#endif
